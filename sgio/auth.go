package sgio

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
)

// The handshake: mutual HMAC-SHA256 challenge-response over fresh nonces, the client first.
//
//	client -> Hello{version, max body, owner, client nonce, incarnation, name}
//	server -> HelloReply{version, sync mode, limits, server nonce}   (no proof: nothing proven yet)
//	client -> Auth{ClientProof(secret, server nonce, client nonce, transcript)}
//	server -> AuthOK{ServerProof(secret, client nonce, server nonce, transcript)}, or, after a
//	          delay, Error{CodeAuthFailed} and close
//	          (the client checks the proof: a server that does not know the secret fails here)
//
// transcript is Transcript(Hello, HelloReply): a digest of both bodies as encoded, so each
// proof also vouches for what the handshake said. A Hello whose owner id or incarnation was
// changed on the way (to take another node's identity) or a HelloReply whose sync mode or
// lease was (to make a client believe in a durability it does not get) fails the proofs.
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

// TranscriptSize is the size of a handshake transcript digest.
const TranscriptSize = sha256.Size

// transcriptLabel starts the transcript digest. Part of the format; do not change.
const transcriptLabel = "weft handshake"

// Transcript reports the digest both proofs cover: SHA-256("weft handshake" || Hello body ||
// HelloReply body), each body as AppendBody encodes it (a parsed message encodes back to the
// bytes it was parsed from: Parse refuses non-zero reserved fields and padding).
func Transcript(h *Hello, r *HelloReply) [TranscriptSize]byte {
	var buf [256]byte // a Hello of the longest name and a HelloReply fit
	b := append(buf[:0], transcriptLabel...)
	b = h.AppendBody(b)
	b = r.AppendBody(b)
	return sha256.Sum256(b)
}

// ServerProof reports the server's proof: HMAC-SHA256(secret, "weft server" || client nonce ||
// server nonce || transcript). Safe for concurrent use.
func ServerProof(secret []byte, clientNonce, serverNonce [NonceSize]byte, transcript [TranscriptSize]byte) [ProofSize]byte {
	return proof(secret, serverLabel, clientNonce, serverNonce, transcript)
}

// ClientProof reports the client's proof: HMAC-SHA256(secret, "weft client" || server nonce ||
// client nonce || transcript). Safe for concurrent use.
func ClientProof(secret []byte, serverNonce, clientNonce [NonceSize]byte, transcript [TranscriptSize]byte) [ProofSize]byte {
	return proof(secret, clientLabel, serverNonce, clientNonce, transcript)
}

// ProofEqual reports whether two proofs are equal, in constant time.
func ProofEqual(a, b [ProofSize]byte) bool { return hmac.Equal(a[:], b[:]) }

func proof(secret []byte, label string, first, second [NonceSize]byte, transcript [TranscriptSize]byte) [ProofSize]byte {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(label))
	mac.Write(first[:])
	mac.Write(second[:])
	mac.Write(transcript[:])
	var p [ProofSize]byte
	mac.Sum(p[:0])
	return p
}

// CheckServerProof reports nil when got is the server's proof for these nonces and transcript,
// else an error wrapping ErrAuthFailed. The client calls it on AuthOK.
func CheckServerProof(secret []byte, clientNonce, serverNonce [NonceSize]byte, transcript [TranscriptSize]byte, got [ProofSize]byte) error {
	if !ProofEqual(ServerProof(secret, clientNonce, serverNonce, transcript), got) {
		return fmt.Errorf("sgio: server proof mismatch (wrong secret, not a Weft storage node, or a handshake changed on the way): %w", ErrAuthFailed)
	}
	return nil
}

// CheckClientProof reports nil when got is the client's proof for these nonces and transcript,
// else an error wrapping ErrAuthFailed. The server calls it on Auth.
func CheckClientProof(secret []byte, serverNonce, clientNonce [NonceSize]byte, transcript [TranscriptSize]byte, got [ProofSize]byte) error {
	if !ProofEqual(ClientProof(secret, serverNonce, clientNonce, transcript), got) {
		return fmt.Errorf("sgio: client proof mismatch (wrong secret): %w", ErrAuthFailed)
	}
	return nil
}
