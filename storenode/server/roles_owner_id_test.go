package server

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/sgio"
)

// TestRolesClientCannotDropReleasedTableByClaimingItsOwnerID: a game server (owner
// testOwner) writes rows to its table and releases it (a graceful stop). Another client (a
// player's machine holding its own owner's secret) claims owner id testOwner in its Hello,
// with an incarnation of its own: with every game server holding the one clients' secret, a
// released id was anyone's to claim (Engine.Connect), mayDrop then found the table's last
// holder was the session's owner, and the drop of another owner's table with acknowledged
// rows succeeded.
//
// What should happen: owner ids are bound to the credential that proves them (an owner's
// derived secret, sgio.DeriveOwnerSecret, proves that owner id only): the claim is refused
// at authentication, the drop under the client's own id is refused with ErrForbidden, and
// the rows stay. Fails on b3f6c9d: no derived secret is accepted (and with the shared
// clients' secret the claim and the drop succeed).
func TestRolesClientCannotDropReleasedTableByClaimingItsOwnerID(t *testing.T) {
	env := startServer(t)
	ctx := srvCtx(t)
	a := env.dial(testOwner, asOwner(testOwner), func(cfg *sgio.ClientConfig) { cfg.Incarnation = [16]byte{0xa} })
	ti, g := srvTable(t, a, "a", testOwner)
	require.NoError(t, a.CallInto(ctx, srvCommit(ti.Table, testOwner, g.Epoch, g.LastSeq+1, []uint64{1}, 5), &sgio.CommitAck{}))
	require.NoError(t, a.CallInto(ctx, &sgio.Release{Owner: testOwner}, &sgio.OK{}))
	require.NoError(t, a.Close())

	const thiefOwner = testOwner + 100
	_, err := env.tryDial(testOwner, asOwner(thiefOwner), func(cfg *sgio.ClientConfig) { cfg.Incarnation = [16]byte{0xb, 0xad} })
	require.ErrorIs(t, err, sgio.ErrAuthFailed, "a client claimed a released owner id with another owner's secret")
	thief := env.dial(thiefOwner, asOwner(thiefOwner))
	err = thief.CallInto(ctx, &sgio.DropTable{Name: "a"}, &sgio.OK{})
	require.ErrorIs(t, err, sgio.ErrForbidden, "a client dropped another game server's released table")
	_, err = env.srv.Engine().OpenTable("a")
	require.NoError(t, err, "the table and its rows are still there")
}

// TestOwnerIDNotTakenOverByPublishedIncarnation: a live game server's identity (owner id
// and incarnation) was taken over by any client that sent the same pair in its Hello: a
// claim of the same incarnation replaces the live connection (Engine.Connect: that is how a
// transaction node's reconnect replaces its stale connection). The incarnation is no secret
// in a cluster: etcd's owner values carry it (cluster.Holder, encodeOwner) for every game
// server holding a partition, and cluster's ownership errors hand the holder to whoever
// asks. So a client read it, claimed the victim's id with it, evicted the victim's
// connection and wrote the victim's table as the victim.
//
// What should happen: a live identity is not replaced on the strength of an owner id and an
// incarnation other game servers can read: each game server holds its own owner's derived
// secret (sgio.DeriveOwnerSecret), which proves no other owner id, so the attacker's claim
// is refused at authentication (ErrAuthFailed) and the victim's session lives on. Fails on
// b3f6c9d: no derived secret is accepted (and with the shared clients' secret the victim's
// connection is closed and the attacker's commit is acknowledged as the victim's).
func TestOwnerIDNotTakenOverByPublishedIncarnation(t *testing.T) {
	env := startServer(t)
	ctx := srvCtx(t)
	inc := [16]byte{0x1c, 0xa7}
	victim := env.dial(testOwner, asOwner(testOwner), func(cfg *sgio.ClientConfig) { cfg.Incarnation = inc })
	ti, g := srvTable(t, victim, "bank", testOwner)
	require.NoError(t, victim.CallInto(ctx, srvCommit(ti.Table, testOwner, g.Epoch, g.LastSeq+1, []uint64{1}, 100), &sgio.CommitAck{}))

	const thiefOwner = testOwner + 100
	thief, err := env.tryDial(testOwner, asOwner(thiefOwner), func(cfg *sgio.ClientConfig) { cfg.Incarnation = inc })
	if err == nil {
		defer thief.Close()
		var g2 sgio.Grant
		if thief.CallInto(ctx, &sgio.Acquire{Table: ti.Table, Owner: testOwner}, &g2) == nil {
			_ = thief.CallInto(ctx, srvCommit(ti.Table, testOwner, g2.Epoch, g2.LastSeq+1, []uint64{1}, 666), &sgio.CommitAck{})
		}
	}
	require.ErrorIs(t, err, sgio.ErrAuthFailed, "a client took a live game server's identity with its published incarnation")
	require.NoError(t, victim.CallInto(ctx, &sgio.Ping{}, &sgio.Pong{}), "the victim's session lives on")
	require.NoError(t, victim.CallInto(ctx, srvCommit(ti.Table, testOwner, g.Epoch, g.LastSeq+2, []uint64{1}, 101), &sgio.CommitAck{}),
		"the victim's grant is still its own")
	// The thief's secret is good for its own owner id.
	env.dial(thiefOwner, asOwner(thiefOwner))
}

// TestRolesClientCannotDropReleasedTableByAcquiringIt: the same drop without claiming any
// owner id: a client of its own owner id Acquires the released table (a released lease is
// anyone's: that is how ownership moves between game servers), which makes it the table's
// last holder, then drops it: mayDrop finds the holder is the session's owner. A game
// server's secret drops any table whose holder released it (or whose lease ran out).
//
// What should happen: a client drops only a table no other owner ever held (never granted,
// or it holds its first grant), so the drop is refused with ErrForbidden and the rows stay.
// Fails on b3f6c9d: the drop succeeds.
func TestRolesClientCannotDropReleasedTableByAcquiringIt(t *testing.T) {
	env := startServer(t)
	ctx := srvCtx(t)
	a := env.dial(testOwner)
	ti, g := srvTable(t, a, "a", testOwner)
	require.NoError(t, a.CallInto(ctx, srvCommit(ti.Table, testOwner, g.Epoch, g.LastSeq+1, []uint64{1}, 5), &sgio.CommitAck{}))
	require.NoError(t, a.CallInto(ctx, &sgio.Release{Owner: testOwner}, &sgio.OK{}))

	const thief = testOwner + 100
	b := env.dial(thief)
	require.NoError(t, b.CallInto(ctx, &sgio.Acquire{Table: ti.Table, Owner: thief}, &sgio.Grant{}))
	require.ErrorIs(t, b.CallInto(ctx, &sgio.DropTable{Name: "a"}, &sgio.OK{}), sgio.ErrForbidden,
		"a client dropped another game server's released table by acquiring it first")
	_, err := env.srv.Engine().OpenTable("a")
	require.NoError(t, err, "the table and its rows are still there")
}
