package sgio

import (
	"encoding/hex"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Known answers from an independent HMAC-SHA256 (Python's hmac module), so the labels and the
// order of the nonces are part of the format.
func TestProofKnownAnswers(t *testing.T) {
	cn, sn := nonce(0), nonce(32)
	secret := []byte("weft-secret")
	sp := ServerProof(secret, cn, sn)
	cp := ClientProof(secret, sn, cn)
	require.Equal(t, "eccfe96f236174c69fcdf05f2e0949c68746f1df5291b55176455639cee7b53b", hex.EncodeToString(sp[:]))
	require.Equal(t, "c556945caac9233d17dceeb86bd80cd894799035a55f119f08da34979bac2a3d", hex.EncodeToString(cp[:]))
	empty := ServerProof(nil, cn, sn)
	require.Equal(t, "3176b13022003752cda060d2b92b9fd9eb7d06c46ec7c82877b3fff4cc170433", hex.EncodeToString(empty[:]))
}

func TestProofs(t *testing.T) {
	cn, sn := NewNonce(), NewNonce()
	require.NotEqual(t, cn, sn, "fresh nonces")
	secret := []byte("s3cret")
	require.NoError(t, CheckServerProof(secret, cn, sn, ServerProof(secret, cn, sn)))
	require.NoError(t, CheckClientProof(secret, sn, cn, ClientProof(secret, sn, cn)))

	require.ErrorIs(t, CheckServerProof([]byte("other"), cn, sn, ServerProof(secret, cn, sn)), ErrAuthFailed)
	require.ErrorIs(t, CheckClientProof([]byte("other"), sn, cn, ClientProof(secret, sn, cn)), ErrAuthFailed)
	// A server proof cannot stand in for a client proof (no reflection), nor swapped nonces.
	require.ErrorIs(t, CheckClientProof(secret, sn, cn, ServerProof(secret, cn, sn)), ErrAuthFailed)
	require.ErrorIs(t, CheckClientProof(secret, cn, sn, ClientProof(secret, sn, cn)), ErrAuthFailed)
	require.True(t, ProofEqual(ServerProof(nil, cn, sn), ServerProof([]byte{}, cn, sn)), "nil and empty secret agree")
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
