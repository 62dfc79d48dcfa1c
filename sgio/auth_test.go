package sgio

import (
	"encoding/hex"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Known answers from an independent HMAC-SHA256 (Python's hmac module), so the labels and the
// order of the nonces and the transcript are part of the format.
func TestProofKnownAnswers(t *testing.T) {
	cn, sn, tr := nonce(0), nonce(32), nonce(64)
	secret := []byte("weft-secret")
	sp := ServerProof(secret, cn, sn, tr)
	cp := ClientProof(secret, sn, cn, tr)
	require.Equal(t, "c3abb4987c088920f397c2220fb92787f46af2f9896d9324edb1cecf1b7ed8b0", hex.EncodeToString(sp[:]))
	require.Equal(t, "733ec3c8c7a67b8e50e6f5f53c33e9bfb4205afbc1ec248b0e992d1892e06056", hex.EncodeToString(cp[:]))
	empty := ServerProof(nil, cn, sn, tr)
	require.Equal(t, "f5aa309098a937eca50294c7aa1566249a472ca96eef92b985b3ff9b1b1ac3b4", hex.EncodeToString(empty[:]))
}

func TestProofs(t *testing.T) {
	cn, sn := NewNonce(), NewNonce()
	require.NotEqual(t, cn, sn, "fresh nonces")
	tr := nonce(9)
	secret := []byte("s3cret")
	require.NoError(t, CheckServerProof(secret, cn, sn, tr, ServerProof(secret, cn, sn, tr)))
	require.NoError(t, CheckClientProof(secret, sn, cn, tr, ClientProof(secret, sn, cn, tr)))

	require.ErrorIs(t, CheckServerProof([]byte("other"), cn, sn, tr, ServerProof(secret, cn, sn, tr)), ErrAuthFailed)
	require.ErrorIs(t, CheckClientProof([]byte("other"), sn, cn, tr, ClientProof(secret, sn, cn, tr)), ErrAuthFailed)
	// A server proof cannot stand in for a client proof (no reflection), nor swapped nonces.
	require.ErrorIs(t, CheckClientProof(secret, sn, cn, tr, ServerProof(secret, cn, sn, tr)), ErrAuthFailed)
	require.ErrorIs(t, CheckClientProof(secret, cn, sn, tr, ClientProof(secret, sn, cn, tr)), ErrAuthFailed)
	// Nor a proof of another handshake's transcript.
	require.ErrorIs(t, CheckClientProof(secret, sn, cn, nonce(10), ClientProof(secret, sn, cn, tr)), ErrAuthFailed)
	require.ErrorIs(t, CheckServerProof(secret, cn, sn, nonce(10), ServerProof(secret, cn, sn, tr)), ErrAuthFailed)
	require.True(t, ProofEqual(ServerProof(nil, cn, sn, tr), ServerProof([]byte{}, cn, sn, tr)), "nil and empty secret agree")
}

// TestTranscriptCoversTheHandshake: every field of Hello and HelloReply changes the
// transcript, so a Hello whose owner id or incarnation was rewritten on the way (to take
// another node's identity), or a HelloReply whose sync mode was, fails the proofs. (Found in
// review: the proofs covered the nonces only.)
func TestTranscriptCoversTheHandshake(t *testing.T) {
	h := Hello{Version: Version, MaxBody: 1 << 20, OwnerID: 7, Nonce: nonce(1), Incarnation: [IncarnationSize]byte{1}, Name: "zone-1"}
	r := HelloReply{Version: Version, SyncMode: SyncAlways, MaxBody: 1 << 24, MaxInflight: 1024, LeaseMillis: 10000, Nonce: nonce(2)}
	base := Transcript(&h, &r)
	require.Equal(t, base, Transcript(&h, &r), "a function of the messages")
	for name, change := range map[string]func(h *Hello, r *HelloReply){
		"owner":       func(h *Hello, _ *HelloReply) { h.OwnerID = 8 },
		"incarnation": func(h *Hello, _ *HelloReply) { h.Incarnation[15] = 1 },
		"name":        func(h *Hello, _ *HelloReply) { h.Name = "zone-2" },
		"max body":    func(h *Hello, _ *HelloReply) { h.MaxBody-- },
		"sync mode":   func(_ *Hello, r *HelloReply) { r.SyncMode = SyncNone },
		"lease":       func(_ *Hello, r *HelloReply) { r.LeaseMillis++ },
		"limits":      func(_ *Hello, r *HelloReply) { r.MaxInflight++ },
		"nonce":       func(_ *Hello, r *HelloReply) { r.Nonce[0]++ },
	} {
		h2, r2 := h, r
		change(&h2, &r2)
		require.NotEqual(t, base, Transcript(&h2, &r2), name)
	}
	// What the server parses is what the client encoded: the transcript agrees.
	var hp Hello
	require.NoError(t, hp.Parse(h.AppendBody(nil)))
	var rp HelloReply
	require.NoError(t, rp.Parse(r.AppendBody(nil)))
	require.Equal(t, base, Transcript(&hp, &rp))
}

func TestParseSecret(t *testing.T) {
	gen := GenerateSecret()
	key, err := ParseSecret([]byte(" " + gen + "\n"))
	require.NoError(t, err)
	require.Len(t, key, 32)
	require.NotEqual(t, gen, GenerateSecret(), "fresh")

	hexKey, err := ParseSecret([]byte("8f1c2be04d6a39e7a5b2c47d10fe6e93"))
	require.NoError(t, err)
	b64Key, err := ParseSecret([]byte("jxwr4E1qOeelssR9EP5ukw=="))
	require.NoError(t, err)
	require.Equal(t, hexKey, b64Key, "hex and base64 of one key agree")
	raw, err := ParseSecret([]byte("jxwr4E1qOeelssR9EP5ukw"))
	require.NoError(t, err)
	require.Equal(t, hexKey, raw, "unpadded base64")

	none, err := ParseSecret([]byte("  \n"))
	require.NoError(t, err)
	require.Nil(t, none, "empty: no secret")

	for _, weak := range []string{
		"topsecret-123",                    // neither hex nor base64
		"s",                                // too short
		"8f1c2be04d6a39e7a5b2c47d10fe6e",   // 15 bytes of hex
		"00000000000000000000000000000000", // 16 bytes, all zero
		"abababababababababababababababab", // a repeated byte pair
		"aGVsbG9oZWxsb2hlbGxvaGVsbG8=",     // base64 of "hellohellohellohello"
	} {
		_, err := ParseSecret([]byte(weak))
		require.ErrorIs(t, err, ErrWeakSecret, "secret %q", weak)
	}
}

// The server's proof comes only in AuthOK: HelloReply has no room for one.
func TestHelloReplyCarriesNoProof(t *testing.T) {
	require.Equal(t, 48, (&HelloReply{}).BodySize())
	require.Equal(t, ProofSize, (&AuthOK{}).BodySize())
	require.GreaterOrEqual(t, int(HandshakeBodyMax()), (&Hello{Name: strings.Repeat("n", NameMax)}).BodySize())
	require.GreaterOrEqual(t, int(HandshakeBodyMax()), (&Auth{}).BodySize())
	require.Less(t, int(HandshakeBodyMax()), 256, "a handshake frame is small")
}

// TestDeriveOwnerSecret: an owner's secret is HMAC-SHA256(clients' key, "weft owner secret
// v1" || owner big-endian) in hex (a known answer computed apart), parses as a secret, and
// differs per owner and from the clients' secret; an empty clients' secret derives nothing.
func TestDeriveOwnerSecret(t *testing.T) {
	clients := []byte("5c8e1f0a9b2d47e6a3f1c0d8b7e69a425c8e1f0a9b2d47e6a3f1c0d8b7e69a42\n")
	s7, err := DeriveOwnerSecret(clients, 7)
	require.NoError(t, err)
	require.Equal(t, "a81226682eded6afcd5fac3ba58d2da36501e93de396cb97f27115b0d339a7df", s7)
	key, err := ParseSecret([]byte(s7))
	require.NoError(t, err)
	ck, err := ParseSecret(clients)
	require.NoError(t, err)
	k7 := DeriveOwnerKey(ck, 7)
	require.Equal(t, k7[:], key)
	s8, err := DeriveOwnerSecret(clients, 8)
	require.NoError(t, err)
	require.NotEqual(t, s7, s8)
	_, err = DeriveOwnerSecret(nil, 7)
	require.ErrorIs(t, err, ErrWeakSecret)
}
