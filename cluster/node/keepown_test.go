package node_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// keepCommit writes value v into row id of table (a 64-byte row) under owner's grant epoch.
func keepCommit(ctx context.Context, cl *sgio.Client, table uint32, owner, epoch, seq, id, v uint64) error {
	var ack sgio.CommitAck
	return cl.CallInto(ctx, &sgio.Commit{Owner: owner, Seq: seq, Fences: []sgio.Fence{{Table: table, Epoch: epoch}},
		Segments: []sgio.Segment{{Table: table, RowBytes: 64, Page: id / 64, Data: 1 << (id % 64), Rows: balanceRow(v)}}}, &ack)
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
	tc := startCluster(t, 2)
	mover := tc.open(t, 0x2, "")
	mtbl, err := mover.CreateTable(ctx, "keep", 64, 2, 1, tc.addrs)
	require.NoError(t, err)
	name := storenode.PartitionTableName("keep", 0)

	const owner = 0x55
	sess, err := tc.c.NewSession(ctx, cluster.SessionConfig{Owner: owner, Addr: "game-5:7000"})
	require.NoError(t, err)
	defer sess.Close(ctx)
	g, err := sess.Acquire(ctx, "keep", 0)
	require.NoError(t, err)
	epoch := g.Epoch()
	src, err := sgio.Dial(ctx, sgio.ClientConfig{Addr: tc.addrs[0], Secret: secret, OwnerID: owner})
	require.NoError(t, err)
	defer src.Close()
	var ti sgio.TableInfo
	require.NoError(t, src.CallInto(ctx, &sgio.OpenTable{Name: name}, &ti))
	var gr sgio.Grant
	require.NoError(t, src.CallInto(ctx, &sgio.Acquire{Table: ti.Table, Flags: sgio.AcquireEtcdGrant, Owner: owner, Epoch: epoch}, &gr))
	var ids sgio.IDRange
	require.NoError(t, src.CallInto(ctx, &sgio.AllocIDs{Table: ti.Table, Pages: 1, Owner: owner, Epoch: epoch}, &ids))
	id := ids.First
	require.NoError(t, keepCommit(ctx, src, ti.Table, owner, epoch, gr.LastSeq+1, id, 7))

	require.NoError(t, mtbl.Move(ctx, 0, tc.addrs[1]))
	h, held, err := tc.c.Owner(ctx, "keep", 0)
	require.NoError(t, err)
	require.True(t, held, "the switch keeps the owner key")
	require.Equal(t, epoch, h.Epoch, "the same grant")
	require.NoError(t, g.Check(), "the owner's grant still vouches")
	m, err := tc.c.ReadMap(ctx)
	require.NoError(t, err)
	require.Less(t, epoch, uint64(m.Tables["keep"].Revs[0]), "the grant is from before the switch")

	// Another node cannot own the partition while the owner's session lives.
	taker := tc.open(t, 0x3, "")
	ttbl, err := taker.OpenTable(ctx, "keep")
	require.NoError(t, err)
	oerr := ttbl.Own(ctx, 0)
	var oe *node.NotOwnerError
	require.ErrorAs(t, oerr, &oe, "another node took the partition from a live owner at the switch")
	require.True(t, oe.Held)
	require.EqualValues(t, owner, oe.Holder.Owner)
	require.Equal(t, epoch, oe.Holder.Epoch)

	// The owner registers the same grant with the target and commits there.
	dst, err := sgio.Dial(ctx, sgio.ClientConfig{Addr: tc.addrs[1], Secret: secret, OwnerID: owner})
	require.NoError(t, err)
	defer dst.Close()
	var dti sgio.TableInfo
	require.NoError(t, dst.CallInto(ctx, &sgio.OpenTable{Name: name}, &dti))
	var dgr sgio.Grant
	require.NoError(t, dst.CallInto(ctx, &sgio.Acquire{Table: dti.Table, Flags: sgio.AcquireEtcdGrant, Owner: owner, Epoch: epoch}, &dgr))
	require.Equal(t, epoch, dgr.Epoch)
	seq := dgr.LastSeq + 1
	require.NoError(t, keepCommit(ctx, dst, dti.Table, owner, epoch, seq, id, 8))
	row := make([]byte, 64)
	require.NoError(t, ttbl.Get(ctx, id, row))
	require.EqualValues(t, 8, balanceOf(row))
	// An older grant than the kept one is fenced at the target.
	var old sgio.Grant
	require.ErrorIs(t, dst.CallInto(ctx, &sgio.Acquire{Table: dti.Table, Flags: sgio.AcquireEtcdGrant, Owner: owner, Epoch: epoch - 1}, &old), storenode.ErrFenced)

	// The owner's lease ends: the other node acquires the partition with a higher epoch and
	// writes; the old owner's late commit at the target is fenced.
	require.NoError(t, sess.Close(ctx))
	require.NoError(t, ttbl.Own(ctx, 0))
	h, held, err = tc.c.Owner(ctx, "keep", 0)
	require.NoError(t, err)
	require.True(t, held)
	require.EqualValues(t, 0x3, h.Owner)
	require.Greater(t, h.Epoch, epoch)
	require.NoError(t, ttbl.Put(ctx, id, balanceRow(9)))
	require.ErrorIs(t, keepCommit(ctx, dst, dti.Table, owner, epoch, seq+1, id, 10), storenode.ErrFenced)
	require.NoError(t, ttbl.Get(ctx, id, row))
	require.EqualValues(t, 9, balanceOf(row))
}
