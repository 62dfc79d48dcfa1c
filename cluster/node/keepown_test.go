package node_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// keepCommit writes value v into row id of table (a 64-byte row) under owner's grant epoch.
func keepCommit(ctx context.Context, cl *sgio.Client, table uint32, owner, epoch, seq, id, v uint64) error {
	var ack sgio.CommitAck
	return cl.CallInto(ctx, &sgio.Commit{Owner: owner, Seq: seq, Fences: []base.Fence{{Table: table, Epoch: epoch}},
		Segments: []base.Segment{{Table: table, RowBytes: 64, Page: id / 64, Data: 1 << (id % 64), Rows: balanceRow(v)}}}, &ack)
}

// A move's switch keeps the owner's grant (docs/cluster.md, "Moving a partition"): while the
// owner's session lives no other node can acquire the moved partition; the owner registers
// the same grant (same epoch) with the target and commits there; once its lease ends
// (revoked here: what etcd does at expiry) another node acquires the partition with a higher
// epoch, and the old owner's late commit at the target is fenced. The owner is a bare
// session and storage-node client, so every step is seen at the wire.
// On b47b8eb the switch deleted the owner key: the other node's Own succeeded at once.
func TestMoveKeepsOwnerGrant(t *testing.T) {
	ctx := testCtx(t)
	tc, _, mtbl := startWithTable(t, ctx, 2, 0x2, "", "keep", 2)
	name := base.PartitionTableName("keep", 0)

	const owner = 0x55
	sess, err := tc.c.NewSession(ctx, cluster.SessionConfig{Owner: owner, Addr: "game-5:7000"})
	require.NoError(t, err)
	defer sess.Close(ctx)
	g, err := sess.Acquire(ctx, "keep", 0)
	require.NoError(t, err)
	epoch := g.Epoch()
	src, srcTable := dialPartition(t, ctx, tc.addrs[0], secret, owner, name)
	var gr sgio.Grant
	require.NoError(t, src.CallInto(ctx, &sgio.Acquire{Table: srcTable, Flags: sgio.AcquireEtcdGrant, Owner: owner, Epoch: epoch}, &gr))
	var ids sgio.IDRange
	require.NoError(t, src.CallInto(ctx, &sgio.AllocIDs{Table: srcTable, Pages: 1, Owner: owner, Epoch: epoch}, &ids))
	id := ids.First
	require.NoError(t, keepCommit(ctx, src, srcTable, owner, epoch, gr.LastSeq+1, id, 7))

	require.NoError(t, mtbl.Move(ctx, 0, tc.addrs[1]))
	h, held := tc.holder(t, ctx, "keep", 0)
	require.True(t, held, "the switch keeps the owner key")
	require.Equal(t, epoch, h.Epoch, "the same grant")
	require.NoError(t, g.Check(), "the owner's grant still vouches")
	m, err := tc.c.ReadMap(ctx)
	require.NoError(t, err)
	require.Less(t, epoch, uint64(m.Tables["keep"].Revs[0]), "the grant is from before the switch")

	// Another node cannot own the partition while the owner's session lives.
	_, ttbl := tc.openNodeTable(t, ctx, 0x3, "keep")
	oerr := ttbl.Own(ctx, 0)
	var oe *node.NotOwnerError
	require.ErrorAs(t, oerr, &oe, "another node took the partition from a live owner at the switch")
	require.True(t, oe.Held)
	require.EqualValues(t, owner, oe.Holder.Owner)
	require.Equal(t, epoch, oe.Holder.Epoch)

	// The owner registers the same grant with the target and commits there.
	dst, dstTable := dialPartition(t, ctx, tc.addrs[1], secret, owner, name)
	var dgr sgio.Grant
	require.NoError(t, dst.CallInto(ctx, &sgio.Acquire{Table: dstTable, Flags: sgio.AcquireEtcdGrant, Owner: owner, Epoch: epoch}, &dgr))
	require.Equal(t, epoch, dgr.Epoch)
	seq := dgr.LastSeq + 1
	require.NoError(t, keepCommit(ctx, dst, dstTable, owner, epoch, seq, id, 8))
	row := make([]byte, 64)
	require.NoError(t, ttbl.Get(ctx, id, row))
	require.EqualValues(t, 8, balanceOf(row))
	// An older grant than the kept one is fenced at the target.
	var old sgio.Grant
	require.ErrorIs(t, dst.CallInto(ctx, &sgio.Acquire{Table: dstTable, Flags: sgio.AcquireEtcdGrant, Owner: owner, Epoch: epoch - 1}, &old), storenode.ErrFenced)

	// The owner's lease ends: the other node acquires the partition with a higher epoch and
	// writes; the old owner's late commit at the target is fenced.
	require.NoError(t, sess.Close(ctx))
	require.NoError(t, ttbl.Own(ctx, 0))
	h, held = tc.holder(t, ctx, "keep", 0)
	require.True(t, held)
	require.EqualValues(t, 0x3, h.Owner)
	require.Greater(t, h.Epoch, epoch)
	require.NoError(t, ttbl.Put(ctx, id, balanceRow(9)))
	require.ErrorIs(t, keepCommit(ctx, dst, dstTable, owner, epoch, seq+1, id, 10), storenode.ErrFenced)
	require.NoError(t, ttbl.Get(ctx, id, row))
	require.EqualValues(t, 9, balanceOf(row))
}

// An Own through a second handle of the owner, switched but not activated yet (the target
// refuses every grant: storenode.ErrMoved), fails, and must not give up the grant the first
// handle holds (txnode releases a refused grant; during a move cluster/node keeps it): the
// first handle writes on under it once the move is complete. Without the keep, the refused
// Own released the grant and the partition could change hands during the move.
func TestMoveOwnDuringSwitchKeepsGrant(t *testing.T) {
	ctx := testCtx(t)
	tc, owner, mover, tbl, id := startOwnedFirst(t, ctx, "own2")
	before := tc.heldBy(t, ctx, "own2", 0)
	mtbl := openTable(t, ctx, mover, "own2")

	release, moved := switchHold(t, ctx, mtbl, tc.addrs[1])
	tbl2 := openTable(t, ctx, owner, "own2")
	require.Equal(t, tc.addrs[1], tbl2.NodeOf(id), "the fresh handle routes to the target")
	require.ErrorIs(t, tbl2.Own(ctx, 0), storenode.ErrMoved, "the target is not live yet")
	h, held := tc.holder(t, ctx, "own2", 0)
	require.True(t, held, "the refused Own kept the grant")
	require.Equal(t, before, h)
	release()
	require.NoError(t, <-moved)

	var perr error
	for try := 0; try < 10; try++ {
		if perr = tbl.Put(ctx, id, balanceRow(2)); perr == nil {
			break
		}
	}
	require.NoError(t, perr, "the first handle writes on under the kept grant")
	h, held = tc.holder(t, ctx, "own2", 0)
	require.True(t, held)
	require.Equal(t, before, h)
}

// An Own refused during a move by a node that owned nothing of the partition (the grant
// taken for it, refused by the not yet live target, kept through the refusal) releases that
// grant: nothing of the node uses it, and held it would keep every other node from the
// partition until the node's session ends.
func TestMoveOwnRefusedReleasesUnused(t *testing.T) {
	ctx := testCtx(t)
	tc, _, mtbl := startWithTable(t, ctx, 2, 0x2, "", "own3", 2)
	release, moved := switchHold(t, ctx, mtbl, tc.addrs[1])

	_, atbl := tc.openNodeTable(t, ctx, 0x1, "own3")
	require.ErrorIs(t, atbl.Own(ctx, 0), storenode.ErrMoved, "the target is not live yet")
	_, held := tc.holder(t, ctx, "own3", 0)
	require.False(t, held, "the refused Own released the grant nothing uses")
	release()
	require.NoError(t, <-moved)

	_, btbl := tc.openNodeTable(t, ctx, 0x3, "own3")
	require.NoError(t, btbl.Own(ctx, 0))
	id := insertRow(t, ctx, btbl, balanceRow(5))
	require.EqualValues(t, 0, btbl.Partition(id))
}

// A mover cut short right after the activation (its context ended), resumed once the
// grant the switch kept has ended: MoveFloor now reads the switch's revision, above the
// floor the copy was activated with, and the copy is live already: the resumed mover must
// not activate it again (storenode refuses a live copy below the floor as not an incoming
// one) and completes the move. Without the check of the target's state the resumed Move
// failed for good.
func TestMoveResumedAfterActivationKeepsFloor(t *testing.T) {
	ctx := testCtx(t)
	tc, _, mtbl := startWithTable(t, ctx, 2, 0x2, "", "res", 2)
	sess, err := tc.c.NewSession(ctx, cluster.SessionConfig{Owner: 0x55})
	require.NoError(t, err)
	defer sess.Close(ctx)
	g, err := sess.Acquire(ctx, "res", 0)
	require.NoError(t, err)

	require.Error(t, moveCutShortAt(t, ctx, mtbl, 0, tc.addrs[1], node.MoveStepActivated), "cut short after the activation")
	require.True(t, tc.moveRecorded(t, ctx, "res", 0), "the move is not done")

	require.NoError(t, g.Release(ctx))
	rec, _, err := tc.c.ReadMove(ctx, "res", 0)
	require.NoError(t, err)
	floor, err := tc.c.MoveFloor(ctx, rec)
	require.NoError(t, err)
	require.Greater(t, floor, g.Epoch(), "the floor read now is above the one the copy took")
	require.NoError(t, mtbl.Move(ctx, 0, tc.addrs[1]), "the resumed move completes")
	require.False(t, tc.moveRecorded(t, ctx, "res", 0))

	_, btbl := tc.openNodeTable(t, ctx, 0x3, "res")
	require.NoError(t, btbl.Own(ctx, 0))
	id := insertRow(t, ctx, btbl, balanceRow(5))
	require.EqualValues(t, 0, btbl.Partition(id))
}
