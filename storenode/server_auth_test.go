package storenode

import (
	"testing"

	"github.com/weftdb/weft/sgio"
)

// TestAuthProofCoversHello: a Hello rewritten on the way (here its owner id, as an on-path
// attacker taking another node's identity would) fails authentication, since the client's
// proof covers the Hello it sent, not the one the server received. Found in review: the
// proofs covered the nonces only, so a rewritten owner id or incarnation went unnoticed.
func TestAuthProofCoversHello(t *testing.T) {
	env := startServer(t)
	raw := dialRaw(t, env.addr)
	hr := raw.hello(8) // what the server receives
	sent := sgio.Hello{Version: sgio.Version, MaxBody: 1 << 20, OwnerID: 7, Nonce: raw.nonce} // what the client sent
	raw.send(1, &sgio.Auth{Proof: sgio.ClientProof(srvKey(t), hr.Nonce, raw.nonce, sgio.Transcript(&sent, &hr))})
	raw.expectError(1, sgio.ErrAuthFailed)
	raw.expectClosed()

	// The same client with the Hello the server saw gets in.
	ok := dialRaw(t, env.addr)
	ok.handshake(7)
}
