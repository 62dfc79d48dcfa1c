package node_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// acctP0 is the storage nodes' table of partition 0 of "acct", the table these tests move.
var acctP0 = base.PartitionTableName("acct", 0)

// The storage node verifies move steps with the verifier it verifies grants with.
var _ storenode.MoveVerifier = (*cluster.GrantVerifier)(nil)

// stranger holds the operators' secret of a storage node (a client's is refused every move
// step: TestMoveNeedsOperatorSecret) but is no mover of the partition: it knows the table's
// id and etcd's revision, nothing of a move record.
type stranger struct {
	cl    *sgio.Client
	table uint32
	v     *cluster.GrantVerifier
}

func newStranger(t *testing.T, ctx context.Context, tc *testCluster, addr, name string) *stranger {
	t.Helper()
	cl, table := dialPartition(t, ctx, addr, operatorSecret, 0x77, name)
	return &stranger{cl: cl, table: table, v: cluster.NewGrantVerifier(tc.c, storenode.ErrFenced)}
}

// rev is etcd's current revision: an epoch at least every recorded move's.
func (s *stranger) rev(t *testing.T, ctx context.Context) uint64 {
	r, err := s.v.Revision(ctx)
	require.NoError(t, err)
	return r
}

func (s *stranger) step(ctx context.Context, op uint8, token, floor uint64) error {
	_, err := s.cl.MoveStep(ctx, &sgio.Move{Op: op, Table: s.table, Token: token, Floor: floor, NextID: 1})
	return err
}

// drop asks the storage node to drop table name.
func (s *stranger) drop(ctx context.Context, name string) error {
	return s.cl.CallInto(ctx, &sgio.DropTable{Name: name}, &sgio.OK{})
}

func (s *stranger) state(t *testing.T, ctx context.Context) storenode.MoveState {
	return moveState(t, ctx, s.cl, s.table)
}

// A client holding the cluster's secret but no move cannot freeze, retire and then drop a
// live partition another owner holds (defect 2 of issue 22): with no move recorded, a freeze
// under any epoch is refused; so is a retire, and the drop of the mapped partition; and
// while a real move is frozen before its switch, a retire under an epoch at least the
// freeze's is refused (etcd's map still places the partition on the source), and so is the
// drop. Every acknowledged row is there after the move. On b3f6c9d the freeze, the retire
// and the drop all succeeded, and the owner's rows were gone.
func TestMoveStrangerCannotRetireAndDropMappedPartition(t *testing.T) {
	ctx := testCtx(t)
	tc, w := startMoveWriter(t, ctx, 8)
	s := newStranger(t, ctx, tc, tc.addrs[0], acctP0)

	attack := func(why string) {
		for _, epoch := range []uint64{1, s.rev(t, ctx), ^uint64(0)} {
			require.ErrorIs(t, s.step(ctx, sgio.MoveOpFreeze, epoch, 0), storenode.ErrFenced, "%s: freeze under epoch %d", why, epoch)
		}
		require.Error(t, s.step(ctx, sgio.MoveOpRetire, s.rev(t, ctx), 0), "%s: retire", why)
		require.ErrorIs(t, s.drop(ctx, acctP0), storenode.ErrTableOwned, "%s: drop", why)
	}
	attack("no move recorded")
	require.Equal(t, storenode.MoveLive, s.state(t, ctx))
	require.False(t, w.put(t, ctx, 0, 2), "the owner writes on")

	_, mtbl := tc.openNodeTable(t, ctx, 0x2, "acct")
	hooked := onMoveStepOnce(t, node.MoveStepFrozen, func() {
		require.Equal(t, storenode.MoveFrozen, s.state(t, ctx))
		require.ErrorIs(t, s.step(ctx, sgio.MoveOpRetire, s.rev(t, ctx), 0), storenode.ErrFenced, "retire before the switch")
		require.ErrorIs(t, s.drop(ctx, acctP0), storenode.ErrTableOwned, "drop of the frozen source")
		require.Equal(t, storenode.MoveFrozen, s.state(t, ctx))
	})
	require.NoError(t, mtbl.Move(ctx, 0, tc.addrs[1]))
	require.True(t, hooked())
	require.Equal(t, storenode.MoveRetired, s.state(t, ctx), "the mover's retire, after the switch")
	w.check(t, ctx, tc.open(t, 0x3, ""))
}

// A copy retired without the map leaving its node (a retire of a store from before the steps
// were verified, done here through the engine's own API) is not dropped while etcd's map
// places the partition there: the drop is refused, its rows stay. On b3f6c9d anyone dropped
// a retired copy.
func TestMoveRetiredCopyNotDroppedWhileMapped(t *testing.T) {
	ctx := testCtx(t)
	tc, owner, tbl := startWithTable(t, ctx, 1, 0x1, "", "acct", 2)
	newMoveWriter(t, ctx, owner, tbl, 4)
	s := newStranger(t, ctx, tc, tc.addrs[0], acctP0)
	// A verified step (refused) tells the node its address, as any move would.
	require.ErrorIs(t, s.step(ctx, sgio.MoveOpFreeze, 1, 0), storenode.ErrFenced)
	eng := tc.srvs[0].Engine()
	_, err := eng.MoveFreeze(s.table, 1)
	require.NoError(t, err)
	require.NoError(t, eng.MoveRetire(s.table, 1))
	require.ErrorIs(t, s.drop(ctx, acctP0), storenode.ErrTableOwned)
	_, err = eng.OpenTable(acctP0)
	require.NoError(t, err, "the copy is kept")
}

// Epochs and floors are clamped to etcd's revision (defect 3 of issue 22): while a move is
// recorded, a freeze of its source under mover epoch 2^64-1 is refused (it could never be
// thawed by a real mover, and the real mover's freeze was fenced); once it switched, an
// activation of the target under floor 2^64-1 (no grant would ever be taken) or epoch
// 2^64-1 is refused. The move then completes and the owner writes at the target. On b3f6c9d
// the freeze under 2^64-1 was taken and the move failed.
func TestMoveEpochsAndFloorsAboveEtcdRevisionRefused(t *testing.T) {
	ctx := testCtx(t)
	tc, w := startMoveWriter(t, ctx, 4)
	src := newStranger(t, ctx, tc, tc.addrs[0], acctP0)
	var dst *stranger

	_, mtbl := tc.openNodeTable(t, ctx, 0x2, "acct")
	var steps []string
	node.SetMoveStepHook(func(step string) {
		steps = append(steps, step)
		switch step {
		case node.MoveStepCopied:
			require.ErrorIs(t, src.step(ctx, sgio.MoveOpFreeze, ^uint64(0), 0), storenode.ErrFenced, "freeze under 2^64-1")
			require.Equal(t, storenode.MoveLive, src.state(t, ctx))
		case node.MoveStepSwitched:
			dst = newStranger(t, ctx, tc, tc.addrs[1], acctP0)
			rev := dst.rev(t, ctx)
			require.ErrorIs(t, dst.step(ctx, sgio.MoveOpActivate, rev, ^uint64(0)), storenode.ErrFenced, "floor 2^64-1")
			require.ErrorIs(t, dst.step(ctx, sgio.MoveOpActivate, ^uint64(0), 1), storenode.ErrFenced, "epoch 2^64-1")
			require.Equal(t, storenode.MoveIncoming, dst.state(t, ctx))
		}
	})
	defer node.SetMoveStepHook(nil)
	require.NoError(t, mtbl.Move(ctx, 0, tc.addrs[1]))
	require.Contains(t, steps, node.MoveStepCopied)
	require.Contains(t, steps, node.MoveStepSwitched)
	require.Equal(t, storenode.MoveLive, dst.state(t, ctx))
	w.reown(t, ctx)
	require.False(t, w.put(t, ctx, 1, 5), "the owner writes at the target")
	w.check(t, ctx, tc.open(t, 0x3, ""))
}

// Thaw and begin are verified too: while a move's source is frozen, a thaw under any epoch
// is refused (the move is recorded: thawed, the source would take writes the final catch-up
// misses); with no move recorded, a begin at the node the map places a never-granted
// partition on is refused (incoming, it would take no grant for good), and the partition's
// owner acquires and writes it. On b3f6c9d both were taken.
func TestMoveThawAndBeginVerified(t *testing.T) {
	ctx := testCtx(t)
	tc, w := startMoveWriter(t, ctx, 4)
	src := newStranger(t, ctx, tc, tc.addrs[0], acctP0)

	_, mtbl := tc.openNodeTable(t, ctx, 0x2, "acct")
	hooked := onMoveStepOnce(t, node.MoveStepFrozen, func() {
		require.ErrorIs(t, src.step(ctx, sgio.MoveOpThaw, src.rev(t, ctx), 0), storenode.ErrFenced, "thaw while the move is recorded")
		require.ErrorIs(t, src.step(ctx, sgio.MoveOpThaw, ^uint64(0), 0), storenode.ErrFenced, "thaw under 2^64-1")
		require.Equal(t, storenode.MoveFrozen, src.state(t, ctx))
	})
	require.NoError(t, mtbl.Move(ctx, 0, tc.addrs[1]))
	require.True(t, hooked())
	w.reown(t, ctx)
	w.check(t, ctx, tc.open(t, 0x3, ""))

	// Partition 1, on tc.addrs[1], was never granted.
	fresh := newStranger(t, ctx, tc, tc.addrs[1], base.PartitionTableName("acct", 1))
	require.ErrorIs(t, fresh.step(ctx, sgio.MoveOpBegin, fresh.rev(t, ctx), 0), storenode.ErrFenced, "begin with no move recorded")
	require.Equal(t, storenode.MoveLive, fresh.state(t, ctx))
	ptbl := openTable(t, ctx, tc.open(t, 0x4, ""), "acct")
	require.NoError(t, ptbl.Own(ctx, 1))
	id := insertRow(t, ctx, ptbl, balanceRow(9))
	require.Equal(t, uint32(1), ptbl.Partition(id))
}

// flakyVerifier is the real verifier whose move reads fail while fails is above zero, each
// failed read counted down: etcd unreachable from the storage node for that many reads.
type flakyVerifier struct {
	*cluster.GrantVerifier
	fails atomic.Int64
}

func (v *flakyVerifier) MovePlace(ctx context.Context, table string, part uint32) (string, string, string, uint64, uint64, error) {
	if v.fails.Add(-1) >= 0 {
		return "", "", "", 0, 0, fmt.Errorf("flaky: %w", cluster.ErrUnavailable)
	}
	return v.GrantVerifier.MovePlace(ctx, table, part)
}

// A move step the storage node could not verify (etcd unreachable from it: ErrBusy on the
// wire) is tried again a bounded number of times: two failed reads and the move completes;
// reads that keep failing end the Move with the error after four tries of its first
// verified step (the target's begin), the move still recorded for the next Move.
func TestMoveStepUnverifiableRetried(t *testing.T) {
	ctx := testCtx(t)
	var v *flakyVerifier
	tc := startClusterVerified(t, 3, func(c *cluster.Client) storenode.GrantVerifier {
		v = &flakyVerifier{GrantVerifier: cluster.NewGrantVerifier(c, storenode.ErrFenced)}
		return v
	})
	n := tc.open(t, 0x1, "")
	tbl := createTable(t, ctx, n, "acct", 64, 2, 1, tc.addrs[:2])

	v.fails.Store(2)
	require.NoError(t, tbl.Move(ctx, 0, tc.addrs[2]))
	require.EqualValues(t, 0, max(v.fails.Load(), 0), "both failures were met")

	v.fails.Store(1 << 30)
	err := tbl.Move(ctx, 1, tc.addrs[2])
	require.ErrorIs(t, err, sgio.ErrBusy)
	require.EqualValues(t, 1<<30-4, v.fails.Load(), "four tries of the begin")
	require.True(t, tc.moveRecorded(t, ctx, "acct", 1), "left for the next Move")
	v.fails.Store(0)
	require.NoError(t, tbl.Move(ctx, 1, tc.addrs[2]))
}
