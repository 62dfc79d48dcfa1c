package server

import (
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// TestAuthProofCoversHello: a Hello rewritten on the way (here its owner id, as an on-path
// attacker taking another node's identity would) fails authentication, since the client's
// proof covers the Hello it sent, not the one the server received. Found in review: the
// proofs covered the nonces only, so a rewritten owner id or incarnation went unnoticed.
func TestAuthProofCoversHello(t *testing.T) {
	env := startServer(t)
	raw := dialRaw(t, env.addr)
	hr := raw.hello(8)                                                                        // what the server receives
	sent := sgio.Hello{Version: sgio.Version, MaxBody: 1 << 20, OwnerID: 7, Nonce: raw.nonce} // what the client sent
	raw.send(1, &sgio.Auth{Proof: sgio.ClientProof(srvKey(t), hr.Nonce, raw.nonce, sgio.Transcript(&sent, &hr))})
	raw.expectError(1, sgio.ErrAuthFailed)
	raw.expectClosed()

	// The same client with the Hello the server saw gets in.
	ok := dialRaw(t, env.addr)
	ok.handshake(7)
}

// TestReplacedConnectionHoldsNothing: once a later claim of the same incarnation replaced a
// connection's identity, that connection no longer holds the owner id, even before its close
// has run (the server's checkHolder refuses its commits, Acquires and AllocIDs in that
// window). Found in review: only the close stopped the old connection.
func TestReplacedConnectionHoldsNothing(t *testing.T) {
	e := openTest(t, storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone})
	inc := storenode.Incarnation{1, 2, 3}
	evicted := 0
	require.NoError(t, e.Connect(5, inc, 1, func() { evicted++ }))
	require.True(t, e.HoldsIdent(5, 1))
	require.NoError(t, e.Connect(5, inc, 2, func() {}))
	require.Equal(t, 1, evicted, "the old connection is closed")
	require.False(t, e.HoldsIdent(5, 1), "and holds nothing meanwhile")
	require.True(t, e.HoldsIdent(5, 2))
	require.NoError(t, e.ReleaseOwner(5, 2))
	require.False(t, e.HoldsIdent(5, 2), "a released id is held by nobody")
}

// TestReplacedConnectionCannotDrop: a DropTable still in flight on a connection whose owner
// id another incarnation claimed since (after a lease of silence: a paused process, its
// connection not yet closed) is refused like its commits, Acquires and AllocIDs. A drop has
// no epoch to fence it, so without the identity check the old incarnation deleted the table
// the new one holds, with all its rows. Fails on d29de3d: DropTable acted on the session's
// owner id without checkHolder.
func TestReplacedConnectionCannotDrop(t *testing.T) {
	var clock fakeClock
	e := openTest(t, storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone, Now: clock.Now})
	old, fresh := storenode.Incarnation{1}, storenode.Incarnation{2}
	require.NoError(t, e.Connect(5, old, 1, func() {}))
	clock.Advance(e.LeaseDuration()) // the old incarnation falls silent for a lease
	require.NoError(t, e.Connect(5, fresh, 2, func() {}))
	ti, err := e.CreateTable("t", 64)
	require.NoError(t, err)
	_, err = e.Acquire(ti.ID, 5, 0)
	require.NoError(t, err)

	srv := &Server{eng: e}
	zombie := &session{srv: srv, id: 1, owner: 5, incarnation: old}
	_, _, err = zombie.exec(&sgio.DropTable{Name: "t"})
	require.ErrorIs(t, err, sgio.ErrIdentityLost)
	require.NotErrorIs(t, err, sgio.ErrFenced, "a lost identity is not a fence")
	_, err = e.OpenTable("t")
	require.NoError(t, err, "the new incarnation's table is still there")

	holder := &session{srv: srv, id: 2, owner: 5, incarnation: fresh}
	_, _, err = holder.exec(&sgio.DropTable{Name: "t"})
	require.NoError(t, err, "the holder's own connection drops it")
}

// TestLapsedConnectionHoldsUntilClaimed: a lease of silence alone does not take a live
// connection's identity (HoldsIdent's doc said it did: "false ... once it lapsed"); the claim
// of another incarnation, which the lapse allows, does.
func TestLapsedConnectionHoldsUntilClaimed(t *testing.T) {
	var clock fakeClock
	e := openTest(t, storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone, Now: clock.Now})
	require.NoError(t, e.Connect(5, storenode.Incarnation{1}, 1, func() {}))
	clock.Advance(2 * e.LeaseDuration())
	require.True(t, e.HoldsIdent(5, 1), "lapsed, not claimed: still its")
	require.NoError(t, e.Connect(5, storenode.Incarnation{2}, 2, func() {}))
	require.False(t, e.HoldsIdent(5, 1), "claimed by another incarnation")
}

// TestConnTokensUniqueAcrossServers: two servers of one engine (Config.Engine: say a plain and
// a TLS listener) give their connections engine-wide unique tokens, as Engine.Connect requires,
// so a reconnect of an incarnation through the other server replaces its old connection.
// Fails on d29de3d: each server numbered its connections from 1, so both were connection 1
// and the old one was neither closed nor stopped from acting as the owner.
func TestConnTokensUniqueAcrossServers(t *testing.T) {
	e := openTest(t, storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone})
	discard := slog.New(slog.DiscardHandler)
	claim := func(srv *Server) *session {
		s := srv.newSession(nil, "127.0.0.1:1")
		s.owner, s.incarnation = 5, storenode.Incarnation{1}
		require.NoError(t, s.claimOwner())
		return s
	}
	old := claim(&Server{eng: e, log: discard})
	fresh := claim(&Server{eng: e, log: discard})
	require.NotEqual(t, old.id, fresh.id)
	require.True(t, old.isClosedNow(), "the incarnation's older connection is closed")
	require.False(t, e.HoldsIdent(5, old.id), "and acts as the owner no more")
	require.True(t, e.HoldsIdent(5, fresh.id))
}
