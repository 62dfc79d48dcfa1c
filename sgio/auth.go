package sgio

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
)

// The handshake: mutual HMAC-SHA256 challenge-response over fresh nonces, the client first.
//
//	client -> Hello{version, max body, owner, client nonce, name}
//	server -> HelloReply{version, sync mode, limits, server nonce}   (no proof: nothing proven yet)
//	client -> Auth{ClientProof(secret, server nonce, client nonce)}
//	server -> AuthOK{ServerProof(secret, client nonce, server nonce)}, or, after a delay,
//	          Error{CodeAuthFailed} and close
//	          (the client checks the proof: a server that does not know the secret fails here)
//
// The client proves first, so a server never hands its proof to a peer that has not proven
// anything: a stranger who connects gets nothing to guess the secret against offline, and its
// online guesses are delayed (storenode's AuthFailDelay), one per connection. An endpoint a
// client connects to still sees the client's proof, so the secret's entropy is what stops
// offline guessing: ParseSecret accepts only hex or base64 of at least SecretBytesMin random
// bytes. The labels differ and each party's proof covers the other's fresh nonce first, so a
// proof can be neither replayed nor reflected. Without a configured secret both sides use an
// empty key (loopback-only deployments): the exchange still runs, and proves only that both
// speak Weft. The handshake authenticates the peers, not the frames after it: across an
// untrusted network, run the protocol over TLS.

// Proof labels. Part of the format; do not change.
const (
	serverLabel = "weft server"
	clientLabel = "weft client"
)

// NewNonce returns a fresh random nonce from crypto/rand.
func NewNonce() [NonceSize]byte {
	var n [NonceSize]byte
	_, _ = rand.Read(n[:]) // crypto/rand.Read never fails; it crashes the program instead
	return n
}

// ServerProof reports the server's proof: HMAC-SHA256(secret, "weft server" || client nonce ||
// server nonce). Safe for concurrent use.
func ServerProof(secret []byte, clientNonce, serverNonce [NonceSize]byte) [ProofSize]byte {
	return proof(secret, serverLabel, clientNonce, serverNonce)
}

// ClientProof reports the client's proof: HMAC-SHA256(secret, "weft client" || server nonce ||
// client nonce). Safe for concurrent use.
func ClientProof(secret []byte, serverNonce, clientNonce [NonceSize]byte) [ProofSize]byte {
	return proof(secret, clientLabel, serverNonce, clientNonce)
}

// ProofEqual reports whether two proofs are equal, in constant time.
func ProofEqual(a, b [ProofSize]byte) bool { return hmac.Equal(a[:], b[:]) }

func proof(secret []byte, label string, first, second [NonceSize]byte) [ProofSize]byte {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(label))
	mac.Write(first[:])
	mac.Write(second[:])
	var p [ProofSize]byte
	mac.Sum(p[:0])
	return p
}

// CheckServerProof reports nil when got is the server's proof for these nonces, else an error
// wrapping ErrAuthFailed. The client calls it on AuthOK.
func CheckServerProof(secret []byte, clientNonce, serverNonce [NonceSize]byte, got [ProofSize]byte) error {
	if !ProofEqual(ServerProof(secret, clientNonce, serverNonce), got) {
		return fmt.Errorf("sgio: server proof mismatch (wrong secret, or not a Weft storage node): %w", ErrAuthFailed)
	}
	return nil
}

// CheckClientProof reports nil when got is the client's proof for these nonces, else an error
// wrapping ErrAuthFailed. The server calls it on Auth.
func CheckClientProof(secret []byte, serverNonce, clientNonce [NonceSize]byte, got [ProofSize]byte) error {
	if !ProofEqual(ClientProof(secret, serverNonce, clientNonce), got) {
		return fmt.Errorf("sgio: client proof mismatch (wrong secret): %w", ErrAuthFailed)
	}
	return nil
}
