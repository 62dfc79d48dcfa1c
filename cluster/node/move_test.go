package node_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/txnode"
)

// moveWriter is the partition's owner writing under a move: Puts of increasing values to a
// fixed set of rows of partition 0, and Inserts; every acknowledged write is remembered, and
// so is every write whose outcome is unknown.
type moveWriter struct {
	n       *node.Node
	name    string
	tbl     *node.Table
	ids     []uint64
	acked   map[uint64]uint64   // id -> last acknowledged value
	unknown map[uint64][]uint64 // id -> values whose Put failed (not acknowledged)
	fresh   map[uint64]uint64   // ids inserted after the move -> value
}

func newMoveWriter(t *testing.T, ctx context.Context, n *node.Node, tbl *node.Table, rows int) *moveWriter {
	w := &moveWriter{n: n, name: tbl.Name(), tbl: tbl, acked: map[uint64]uint64{}, unknown: map[uint64][]uint64{}, fresh: map[uint64]uint64{}}
	require.NoError(t, tbl.Own(ctx, 0))
	for len(w.ids) < rows {
		id := insertRow(t, ctx, tbl, balanceRow(1))
		require.Equal(t, uint32(0), tbl.Partition(id))
		w.ids = append(w.ids, id)
		w.acked[id] = 1
	}
	return w
}

// startMoveWriter starts a cluster of two storage nodes and an owner node (0x1, game-1:7000)
// whose table "acct" of two partitions gets rows rows in partition 0 (newMoveWriter).
func startMoveWriter(t *testing.T, ctx context.Context, rows int) (*testCluster, *moveWriter) {
	t.Helper()
	tc, owner, tbl := startWithTable(t, ctx, 2, 0x1, "game-1:7000", "acct", 2)
	return tc, newMoveWriter(t, ctx, owner, tbl, rows)
}

// put writes value v to row i; it reports whether the owner lost the partition.
func (w *moveWriter) put(t *testing.T, ctx context.Context, i int, v uint64) bool {
	id := w.ids[i%len(w.ids)]
	err := w.tbl.Put(ctx, id, balanceRow(v))
	if err == nil {
		w.acked[id] = v
		return false
	}
	w.unknown[id] = append(w.unknown[id], v)
	var ne *node.NotOwnerError
	require.True(t, errors.As(err, &ne) || errors.Is(err, storenode.ErrFenced) || errors.Is(err, txnode.ErrLeaseExpired),
		"a write during a move fails as not-owner or fenced, got %v", err)
	return true
}

// grant reads the current holder of partition 0 from etcd: it must be held.
func (w *moveWriter) grant(t *testing.T, ctx context.Context) cluster.Holder {
	h, held, err := w.n.Client().Owner(ctx, w.name, 0)
	require.NoError(t, err)
	require.True(t, held, "partition 0 is owned")
	return h
}

// reown opens a fresh handle (the switched map) and owns partition 0 again: a new grant.
func (w *moveWriter) reown(t *testing.T, ctx context.Context) {
	tbl, err := w.n.OpenTable(ctx, w.name)
	require.NoError(t, err)
	require.NoError(t, tbl.Own(ctx, 0))
	w.tbl = tbl
}

// check reads every row from the storage node now serving partition 0 (durable rows, by a
// node that owns nothing) and finds each acknowledged value, or a later unacknowledged one.
func (w *moveWriter) check(t *testing.T, ctx context.Context, reader *node.Node) {
	tbl, err := reader.OpenTable(ctx, w.name)
	require.NoError(t, err)
	row := make([]byte, 64)
	for _, id := range w.ids {
		require.NoError(t, tbl.Get(ctx, id, row))
		got, want := balanceOf(row), w.acked[id]
		if got != want {
			require.Contains(t, w.unknown[id], got, "row %d: acknowledged %d, found %d", id, want, got)
			require.Greater(t, got, want, "row %d: an acknowledged write lost", id)
		}
	}
	for id, v := range w.fresh {
		require.NoError(t, tbl.Get(ctx, id, row))
		require.Equal(t, v, balanceOf(row), "row %d inserted after the move", id)
	}
}

// A partition moved while its owner writes: every acknowledged write is on the new copy; the
// owner's writes during the freeze fail (never acknowledged), it owns the partition on the
// new storage node under the same grant (the switch keeps it) and writes on; the old copy is
// fenced for good.
// The owner writes until the move is done; the mover waits, once the source is frozen, for
// one write of the owner (which must fail), so a write during the freeze is certain however
// the two goroutines are scheduled. Without that wait, on a loaded machine the writes could
// all land before the freeze or after the switch (when the owner's Table, following the map,
// has already owned the partition again on the new copy: follow.go), and none of them fail.
func TestMoveUnderWriteLoad(t *testing.T) {
	ctx := testCtx(t)
	rows, writes := 200, 600
	if testing.Short() {
		rows, writes = 40, 150
	}
	tc, w := startMoveWriter(t, ctx, rows)
	before := w.grant(t, ctx)

	_, mtbl := tc.openNodeTable(t, ctx, 0x2, "acct")
	started, moved := make(chan struct{}), make(chan error, 1)
	frozen, wrote := make(chan struct{}), make(chan struct{})
	node.SetMoveStepHook(func(step string) {
		if step == node.MoveStepFrozen {
			close(frozen)
			select { // the owner writes to the frozen source (bounded by ctx if it never does)
			case <-wrote:
			case <-ctx.Done():
			}
		}
	})
	defer node.SetMoveStepHook(nil)
	go func() {
		<-started
		moved <- mtbl.Move(ctx, 0, tc.addrs[1])
	}()

	done := false
	for v := uint64(2); !done || v < uint64(writes); v++ {
		if v == uint64(writes/4) {
			close(started)
		}
		select {
		case err := <-moved:
			require.NoError(t, err)
			require.FailNow(t, "the move ended without its freeze")
		default:
		}
		if done {
			require.False(t, w.put(t, ctx, int(v), v), "a write after the move, owned again")
			continue
		}
		isFrozen := false
		select {
		case <-frozen:
			isFrozen = true
		default:
		}
		if !w.put(t, ctx, int(v), v) {
			require.False(t, isFrozen, "a write to the frozen source acknowledged")
			continue
		}
		// Lost the partition: the move froze it. Its mover waits for a write to the frozen
		// source (this one, if it saw the freeze; else the next): then for the move.
		if !isFrozen {
			select {
			case <-frozen:
			case err := <-moved:
				require.NoError(t, err)
				require.FailNow(t, "the move ended without its freeze")
			}
			v++
			require.True(t, w.put(t, ctx, int(v), v), "a write to the frozen source acknowledged")
		}
		close(wrote)
		require.NoError(t, <-moved)
		done = true
		w.reown(t, ctx)
	}
	// Writes and inserts on the new copy.
	for i := range 20 {
		v := uint64(writes + 1 + i)
		require.False(t, w.put(t, ctx, i, v))
		id, err := w.tbl.Insert(ctx, balanceRow(v))
		require.NoError(t, err)
		w.fresh[id] = v
	}
	require.Equal(t, tc.addrs[1], w.tbl.NodeOf(w.ids[0]))
	require.Equal(t, tc.addrs[1], tc.placed(t, ctx, "acct", 0))
	require.False(t, tc.moveRecorded(t, ctx, "acct", 0), "the move record is gone")
	require.Equal(t, before, w.grant(t, ctx), "the owner's grant outlives the move: the switch keeps it")

	reader := tc.open(t, 0x3, "")
	w.check(t, ctx, reader)

	// The old copy is fenced for good: it serves nothing.
	cl, table := dialPartition(t, ctx, tc.addrs[0], operatorSecret, 0, base.PartitionTableName("acct", 0))
	require.Equal(t, storenode.MoveRetired, moveState(t, ctx, cl, table))
	var segs sgio.Segments
	err := cl.CallInto(ctx, &sgio.ReadPages{Wants: []base.PageWant{{Table: table, Page: w.ids[0] / 64, Want: 1}}}, &segs)
	require.ErrorIs(t, err, storenode.ErrMoved)

	// A move to where the partition is: a no-op.
	require.NoError(t, w.tbl.Move(ctx, 0, tc.addrs[1]))
}

// A second move of a partition while one is recorded is refused, naming it; the same move is
// refused while its mover lives, and taken over once its lease is gone.
func TestMoveInProgressRefused(t *testing.T) {
	ctx := testCtx(t)
	tc := startCluster(t, 3)
	n := tc.open(t, 0x1, "")
	tbl := createTable(t, ctx, n, "acct", 64, 2, 1, tc.addrs[:2])
	other := tc.open(t, 0x9, "")
	tm := tbl.Map()
	_, _, err := tc.c.BeginMove(ctx, cluster.MoveRecord{Table: "acct", Part: 0, Created: tm.Created, Rev: tm.Revs[0],
		From: tc.addrs[0], To: tc.addrs[2], Lease: other.Session().Lease()})
	require.NoError(t, err)
	err = tbl.Move(ctx, 0, tc.addrs[1])
	require.ErrorIs(t, err, cluster.ErrMoveInProgress, "another move")
	err = tbl.Move(ctx, 0, tc.addrs[2])
	require.ErrorIs(t, err, cluster.ErrMoveInProgress, "the same move, its mover alive")
	require.NoError(t, other.Close(ctx)) // revokes its lease: as a mover that died, one TTL later
	// The recorded move is taken over by a Move to its target, and completes.
	require.NoError(t, tbl.Move(ctx, 0, tc.addrs[2]))
	require.Equal(t, tc.addrs[2], tc.placed(t, ctx, "acct", 0))
}

// A partition with a transaction in doubt at its source is not moved: the move rolls back
// (the source live, the map and the record untouched) and succeeds once it is decided.
func TestMoveRefusedInDoubt(t *testing.T) {
	ctx := testCtx(t)
	tc, _, tbl := startWithTable(t, ctx, 2, 0x1, "", "acct", 2)

	// A coordinator's prepare on partition 0 at its storage node, never decided.
	const owner = 0x55
	sess, err := tc.c.NewSession(ctx, cluster.SessionConfig{Owner: owner})
	require.NoError(t, err)
	defer sess.Close(ctx)
	g, err := sess.Acquire(ctx, "acct", 0)
	require.NoError(t, err)
	// The operator's secret: the test steps the move itself too (MoveOpStatus).
	cl, table := dialPartition(t, ctx, tc.addrs[0], operatorSecret, owner, base.PartitionTableName("acct", 0))
	var gr sgio.Grant
	require.NoError(t, cl.CallInto(ctx, &sgio.Acquire{Table: table, Flags: sgio.AcquireEtcdGrant, Owner: owner, Epoch: g.Epoch()}, &gr))
	var ids sgio.IDRange
	require.NoError(t, cl.CallInto(ctx, &sgio.AllocIDs{Table: table, Pages: 1, Owner: owner, Epoch: g.Epoch()}, &ids))
	txn := [sgio.TxnIDSize]byte{1, 2, 3}
	page, slot := ids.First/64, ids.First%64
	_, err = cl.PrepareTxn(ctx, &sgio.TxnPrepare{Txn: txn, Lease: sess.Lease(), Commit: sgio.Commit{Owner: owner, Seq: gr.LastSeq + 1,
		Fences:   []base.Fence{{Table: table, Epoch: g.Epoch()}},
		Segments: []base.Segment{{Table: table, RowBytes: 64, Page: page, Data: 1 << slot, Rows: balanceRow(7)}}}})
	require.NoError(t, err)
	require.NoError(t, g.Release(ctx)) // the owner key must not stop the move: the transaction must

	// The move waits for the transaction for its bound (10 s), on a fake clock here: each
	// pause between freezes is a second of it.
	var fake atomic.Int64
	start := time.Now()
	restore := node.SetMoveTimer(func(time.Duration) (<-chan time.Time, func() bool) {
		fake.Add(int64(time.Second))
		c := make(chan time.Time, 1)
		c <- start
		return c, func() bool { return false }
	}, func() time.Time { return start.Add(time.Duration(fake.Load())) })
	err = tbl.Move(ctx, 0, tc.addrs[1])
	restore()
	require.ErrorIs(t, err, node.ErrMoveRefused)
	require.ErrorIs(t, err, storenode.ErrTxnLocked)
	require.Contains(t, err.Error(), "for 10s (11 freezes refused; a move waits at most 10s", "the message says why")
	require.Equal(t, tc.addrs[0], tc.placed(t, ctx, "acct", 0), "not switched")
	require.False(t, tc.moveRecorded(t, ctx, "acct", 0), "rolled back")
	require.Equal(t, storenode.MoveLive, moveState(t, ctx, cl, table), "the source is live")

	// Decided (abort): the move goes through.
	require.NoError(t, cl.ApplyTxn(ctx, txn, sgio.TxnAbort))
	require.NoError(t, tbl.Move(ctx, 0, tc.addrs[1]))
}

// A second Move of a partition on the node already running one is refused: the move record
// names the mover by its node's lease, so it was taken for a retry (same mover epoch) and
// both ran, one's writes of rows read before the freeze able to land over the other's final
// catch-up.
func TestMoveConcurrentSameNodeRefused(t *testing.T) {
	ctx := testCtx(t)
	tc, n, tbl := startWithTable(t, ctx, 2, 0x1, "", "acct", 2)
	other := openTable(t, ctx, n, "acct")
	var second error
	var fired atomic.Bool
	node.SetMoveStepHook(func(step string) {
		if step == node.MoveStepCopied && fired.CompareAndSwap(false, true) {
			second = other.Move(ctx, 0, tc.addrs[1])
		}
	})
	defer node.SetMoveStepHook(nil)
	require.NoError(t, tbl.Move(ctx, 0, tc.addrs[1]))
	require.ErrorIs(t, second, cluster.ErrMoveInProgress)
	require.Equal(t, tc.addrs[1], tc.placed(t, ctx, "acct", 0))
}

// TestMoveNeedsOperatorSecret: a move's steps are operators' requests (docs/operations.md,
// "Roles and credentials"): a node without the operators' secret cannot move a partition
// (its client secret is refused with ErrForbidden) and nothing is switched.
func TestMoveNeedsOperatorSecret(t *testing.T) {
	ctx := testCtx(t)
	tc := startCluster(t, 2)
	n := tc.openConfig(t, node.Config{Session: cluster.SessionConfig{Owner: 0x1}, OperatorSecret: []byte{}})
	tbl := createTable(t, ctx, n, "acct", 64, 2, 1, tc.addrs)
	err := tbl.Move(ctx, 0, tc.addrs[1])
	require.ErrorIs(t, err, sgio.ErrForbidden)
	require.Equal(t, tc.addrs[0], tc.placed(t, ctx, "acct", 0), "not switched")
}

// A freeze is its mover's: the thaw of a mover whose move was given up (its rollback's thaw,
// late) does not undo the freeze of a mover that took the frozen source over since, under a
// higher mover epoch: the owner's writes stay refused until that move switches. Each freeze
// is its mover's recorded move (the storage node verifies it in etcd): the first mover's
// record, then the successor's that took it over once the first's lease was gone.
func TestMoveLateThawRefused(t *testing.T) {
	ctx := testCtx(t)
	tc, _, tbl := startWithTable(t, ctx, 2, 0x1, "", "acct", 2)
	tm := tbl.Map()
	first, err := tc.c.NewSession(ctx, cluster.SessionConfig{Owner: 0x8})
	require.NoError(t, err)
	rec := cluster.MoveRecord{Table: "acct", Part: 0, Created: tm.Created, Rev: tm.Revs[0], From: tc.addrs[0], To: tc.addrs[1], Lease: first.Lease()}
	_, e1, err := tc.c.BeginMove(ctx, rec)
	require.NoError(t, err)
	cl, table := dialPartition(t, ctx, tc.addrs[0], operatorSecret, 0, base.PartitionTableName("acct", 0))
	_, err = cl.MoveStep(ctx, &sgio.Move{Op: sgio.MoveOpFreeze, Table: table, Token: uint64(e1)}) // the first mover
	require.NoError(t, err)
	require.NoError(t, first.Close(ctx)) // its lease revoked: as a mover that died
	second, err := tc.c.NewSession(ctx, cluster.SessionConfig{Owner: 0x9})
	require.NoError(t, err)
	defer second.Close(ctx)
	rec.Lease = second.Lease()
	rec2, e2, err := tc.c.BeginMove(ctx, rec) // taken over
	require.NoError(t, err)
	require.Greater(t, e2, e1)
	_, err = cl.MoveStep(ctx, &sgio.Move{Op: sgio.MoveOpFreeze, Table: table, Token: uint64(e2)}) // its successor
	require.NoError(t, err)
	_, err = cl.MoveStep(ctx, &sgio.Move{Op: sgio.MoveOpThaw, Table: table, Token: uint64(e1)})
	require.ErrorIs(t, err, storenode.ErrFenced, "the first mover's late thaw, the successor's move recorded")
	deleted, err := tc.c.EndMove(ctx, rec2)
	require.NoError(t, err)
	require.True(t, deleted)
	_, err = cl.MoveStep(ctx, &sgio.Move{Op: sgio.MoveOpThaw, Table: table, Token: uint64(e1)})
	require.ErrorIs(t, err, storenode.ErrFenced, "the first mover's late thaw, after the successor's record went")
	require.Equal(t, storenode.MoveFrozen, moveState(t, ctx, cl, table))
	_, err = cl.MoveStep(ctx, &sgio.Move{Op: sgio.MoveOpThaw, Table: table, Token: uint64(e2)})
	require.NoError(t, err, "the successor's thaw (its rollback)")
}

// A table of the partition's name already on the target with another layout (a leftover of
// another table) is not filled and switched to: the move is refused and rolled back, the map
// untouched. It was switched to, and the partition could no longer be opened.
func TestMoveRefusedOtherLayoutAtTarget(t *testing.T) {
	ctx := testCtx(t)
	tc, n, tbl := startWithTable(t, ctx, 2, 0x1, "", "acct", 2)
	// Created on the engine: a client's CreateClusterTable of a partition the map places on
	// another node is refused (storenode's VerifyClusterCreate).
	_, err := tc.srvs[1].Engine().CreateClusterTable(base.PartitionTableName("acct", 0), 64,
		base.ClusterLayout{Partitions: 1, StripePages: 1, Partition: 0})
	require.NoError(t, err)

	err = tbl.Move(ctx, 0, tc.addrs[1])
	require.ErrorIs(t, err, node.ErrMoveRefused)
	require.Equal(t, tc.addrs[0], tc.placed(t, ctx, "acct", 0), "not switched")
	require.False(t, tc.moveRecorded(t, ctx, "acct", 0), "rolled back")
	openTable(t, ctx, n, "acct")
}
