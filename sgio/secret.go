package sgio

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"fmt"
)

// Secrets. The handshake's proofs can be attacked offline by whoever sees one (an endpoint
// that accepts a client's connection sees the client's proof), so the secret's entropy is the
// real defence: both sides accept only a secret written as hex or base64 of at least
// SecretBytesMin random bytes (GenerateSecret makes one; `storenode -gen-secret` prints one).
// The HMAC key is the decoded bytes, so the hex and the base64 spelling of one key agree.

// SecretBytesMin is the least number of random bytes a secret must encode.
const SecretBytesMin = 16

// secretDistinctMin is the least number of distinct byte values among the first
// SecretBytesMin bytes of a key: 16 random bytes have fewer than 8 distinct values with a
// probability below 1e-12, while "aaaa..." or a repeated short word is refused.
const secretDistinctMin = 8

// ParseSecret decodes a configured secret: surrounding white space is ignored, then hex is
// tried, then base64 (standard or URL alphabet, padded or not). It returns the HMAC key, or an
// error wrapping ErrWeakSecret for anything but hex or base64 of at least SecretBytesMin bytes
// that look random. An empty text returns a nil key and no error: no secret (loopback
// deployments only; the caller decides where that is allowed). Safe for concurrent use.
func ParseSecret(text []byte) ([]byte, error) {
	t := bytes.TrimSpace(text)
	if len(t) == 0 {
		return nil, nil
	}
	key, err := hex.DecodeString(string(t))
	if err != nil {
		key = nil
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
			if k, err := enc.DecodeString(string(t)); err == nil {
				key = k
				break
			}
		}
	}
	if key == nil {
		return nil, fmt.Errorf("sgio: secret of %d characters is neither hex nor base64: %w", len(t), ErrWeakSecret)
	}
	if len(key) < SecretBytesMin {
		return nil, fmt.Errorf("sgio: secret encodes %d bytes, at least %d needed: %w", len(key), SecretBytesMin, ErrWeakSecret)
	}
	var seen [256]bool
	distinct := 0
	for _, b := range key[:SecretBytesMin] {
		if !seen[b] {
			seen[b] = true
			distinct++
		}
	}
	if distinct < secretDistinctMin {
		return nil, fmt.Errorf("sgio: secret's first %d bytes hold %d distinct values: not random: %w",
			SecretBytesMin, distinct, ErrWeakSecret)
	}
	return key, nil
}

// GenerateSecret returns a new secret: hex of 32 bytes from crypto/rand.
func GenerateSecret() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails; it crashes the program instead
	return hex.EncodeToString(b[:])
}

// Owner secrets. Every game server would otherwise hold the one clients' secret, which
// proves any owner id a Hello claims. An owner's secret is derived from the clients' key:
// a storage node, knowing only the clients' secret, checks a handshake's proof against it
// for the owner id that Hello claims, and a session so proven is that owner's only (it
// cannot claim another id: its key proves no other). The clients' secret itself still
// proves any owner id (trusted deployments, transaction nodes that act for many owners).

// ownerSecretLabel starts the derivation of an owner's key. Part of the format; do not change.
const ownerSecretLabel = "weft owner secret v1"

// OwnerKeySize is the size of an owner's derived key.
const OwnerKeySize = sha256.Size

// DeriveOwnerKey reports owner's HMAC key: HMAC-SHA256(clients' key, "weft owner secret v1" ||
// owner as 8 bytes big-endian). clientsKey is ParseSecret's key of the clients' secret. Safe
// for concurrent use.
func DeriveOwnerKey(clientsKey []byte, owner uint64) [OwnerKeySize]byte {
	var msg [len(ownerSecretLabel) + 8]byte
	copy(msg[:], ownerSecretLabel)
	binary.BigEndian.PutUint64(msg[len(ownerSecretLabel):], owner)
	mac := hmac.New(sha256.New, clientsKey)
	mac.Write(msg[:])
	var k [OwnerKeySize]byte
	mac.Sum(k[:0])
	return k
}

// DeriveOwnerSecret reports owner's secret, as a secret text (hex, as GenerateSecret writes
// one), derived from the clients' secret text (`storenode -derive-owner-secret`). An empty or
// weak clients' secret is an error wrapping ErrWeakSecret: there is nothing to derive from.
func DeriveOwnerSecret(clientsSecret []byte, owner uint64) (string, error) {
	key, err := ParseSecret(clientsSecret)
	if err != nil {
		return "", err
	}
	if key == nil {
		return "", fmt.Errorf("sgio: no clients' secret to derive owner %d's secret from: %w", owner, ErrWeakSecret)
	}
	k := DeriveOwnerKey(key, owner)
	return hex.EncodeToString(k[:]), nil
}
