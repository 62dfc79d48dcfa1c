package node_test

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/txnode"
)

// openWriteBack opens a cluster node of owner id owner in WriteBack mode whose flusher never
// runs on its own: what it acknowledged stays only in its cache until something asks.
func (tc *testCluster) openWriteBack(t *testing.T, owner uint64) *node.Node {
	t.Helper()
	return tc.openConfig(t, node.Config{Session: cluster.SessionConfig{Owner: owner}, Durability: txnode.WriteBack, FlushInterval: 1 << 40})
}

// A move keeps the writes a WriteBack owner acknowledged before it: the mover asks the owner
// to flush before it freezes the source (moveflush.go). Before, the frozen source refused
// the owner's epoch (ErrMoved), the copy went without it, and after the switch even the
// owner read the old row, with no error anywhere (a hostile review, session 11).
func TestMoveKeepsWriteBackWrites(t *testing.T) {
	ctx := testCtx(t)
	resumed := hearMoveFlush(t, "resumed")
	tc := startCluster(t, 2)
	owner := tc.openWriteBack(t, 0xa2)
	tbl := createTable(t, ctx, owner, "wb", 64, 2, 1, tc.addrs)
	require.NoError(t, tbl.Own(ctx, 0))
	id := insertRow(t, ctx, tbl, balanceRow(1))
	require.EqualValues(t, 0, tbl.Partition(id))
	require.NoError(t, tbl.Put(ctx, id, balanceRow(7)), "acknowledged, in the owner's cache only")

	_, mt := tc.openNodeTable(t, ctx, 0xd, "wb")
	require.NoError(t, mt.Move(ctx, 0, tc.addrs[1]))

	got := make([]byte, 64)
	require.NoError(t, mt.Get(ctx, id, got), "another node reads the moved copy's durable row")
	require.Equal(t, balanceRow(7), got, "the acknowledged write was copied")
	requireRow(t, ctx, tbl, id, got, balanceRow(7), "the owner reads its write")
	// The owner writes on, on the target, once it heard the move end.
	waitStep(t, resumed)
	require.NoError(t, tbl.Put(ctx, id, balanceRow(8)))
	require.NoError(t, owner.Close(ctx))
	requireRow(t, ctx, mt, id, got, balanceRow(8), "flushed to the target at Close")
}

// From the owner's flush until the move ends, its writes of the partition are refused as
// not-owner (never acknowledged: the frozen source would refuse them), other partitions'
// go on; once the move ended it writes the partition on the target.
func TestMoveHoldsWriteBackWritesUntilItEnds(t *testing.T) {
	ctx := testCtx(t)
	resumed := hearMoveFlush(t, "resumed")
	tc := startCluster(t, 2)
	owner := tc.openWriteBack(t, 0xa3)
	tbl, ids := ownTwo(t, ctx, tc, owner)

	flushed, release := make(chan struct{}), make(chan struct{})
	node.SetMoveStepHook(func(step string) {
		if step == node.MoveStepFlushed {
			close(flushed)
			<-release
		}
	})
	defer node.SetMoveStepHook(nil)
	_, mt := tc.openNodeTable(t, ctx, 0xd, "wb")
	errc := make(chan error, 1)
	go func() { errc <- mt.Move(ctx, 0, tc.addrs[1]) }()
	select {
	case <-flushed:
	case err := <-errc:
		close(release)
		t.Fatalf("the move ended before the owner flushed: %v", err)
	}
	err := tbl.Put(ctx, ids[0], balanceRow(2))
	var ne *node.NotOwnerError
	require.True(t, errors.As(err, &ne), "a held write is not-owner, got %v", err)
	require.True(t, ne.Held)
	require.ErrorIs(t, err, txnode.ErrMoved)
	require.NoError(t, tbl.Put(ctx, ids[1], balanceRow(3)), "the other partition is written on")
	close(release)
	require.NoError(t, <-errc)
	waitStep(t, resumed)
	require.NoError(t, tbl.Put(ctx, ids[0], balanceRow(4)))
	got := make([]byte, 64)
	requireRow(t, ctx, tbl, ids[0], got, balanceRow(4))
	require.NoError(t, owner.Close(ctx))
	requireRow(t, ctx, mt, ids[0], got, balanceRow(4))
	requireRow(t, ctx, mt, ids[1], got, balanceRow(3))
}

// A move rolled back after the owner flushed (here: a two-phase commit of the owner held in
// doubt at the source past the move's wait) ends the request, and the owner writes the
// partition again at its source. The transaction, decided after the flush, is applied, and
// its rows, installed in a held table, are not sent again to the source (which may be
// frozen by then: it would refuse the epoch and fail the owner's pipeline).
func TestMoveRolledBackResumesWriteBackWrites(t *testing.T) {
	ctx := testCtx(t)
	resumed := hearMoveFlush(t, "resumed")
	answered := hearMoveFlush(t, "answered")
	tc := startTxnCluster(t, 2, nil)
	owner := tc.openWriteBack(t, 0xa4)
	tbl := createTable(t, ctx, owner, "wb", 64, 2, 1, tc.addrs)
	require.NoError(t, tbl.Own(ctx, 0, 1))
	var ids [2]uint64
	for ids[0] == 0 || ids[1] == 0 {
		id := insertRow(t, ctx, tbl, acctRow(initial, 0))
		ids[tbl.Partition(id)] = id
	}

	defer node.SetMoveDoubtWait(200 * time.Millisecond)()
	moved := make(chan struct{})
	holding, restoreHook := holdCoordAt(ctx, "prepared-all", moved)
	defer restoreHook()
	xerr := make(chan error, 1)
	go func() { xerr <- xfer(ctx, owner, tbl, ids[0], ids[1], 10) }()
	<-holding

	_, mt := tc.openNodeTable(t, ctx, 0xd, "wb")
	err := mt.Move(ctx, 0, tc.addrs[1])
	require.ErrorIs(t, err, node.ErrMoveRefused, "the transaction in doubt outlasted the move's wait")
	waitStep(t, answered)
	close(moved)
	require.NoError(t, <-xerr, "the transaction commits")
	waitStep(t, resumed)

	require.NoError(t, tbl.Put(ctx, ids[0], acctRow(7, 0)), "written again at the source")
	require.NoError(t, owner.Close(ctx), "its flush at Close: nothing was refused")
	got := make([]byte, 64)
	requireRow(t, ctx, mt, ids[1], got, acctRow(initial+10, 1), "the transaction's rows are durable")
	requireRow(t, ctx, mt, ids[0], got, acctRow(7, 0))
	require.Equal(t, tc.addrs[0], mt.NodeOf(ids[0]), "the partition stayed")
}

// A two-phase commit of the owner decided after its flush for a move (its part in doubt at
// the source made the freeze wait) installs its rows in the held table: they are applied at
// the source already, so they must not be sent again, for the source is frozen and then
// retired; an epoch holding them would be refused and fail the owner's pipeline, losing the
// acknowledged writes of the partitions beside it on that storage node.
func TestMoveAfterTwoPhaseCommitKeepsWriteBackPipeline(t *testing.T) {
	ctx := testCtx(t)
	resumed := hearMoveFlush(t, "resumed")
	tc := startTxnCluster(t, 2, nil)
	owner := tc.openWriteBack(t, 0xa5)
	a, b := tc.addrs[0], tc.addrs[1]
	tbl := createTable(t, ctx, owner, "wb", 64, 3, 1, []string{a, b, a})
	require.NoError(t, tbl.Own(ctx, 0, 1, 2))
	var ids [3]uint64
	for ids[0] == 0 || ids[1] == 0 || ids[2] == 0 {
		id := insertRow(t, ctx, tbl, acctRow(initial, 0))
		if ids[tbl.Partition(id)] == 0 {
			ids[tbl.Partition(id)] = id
		}
	}

	release := make(chan struct{})
	holding, restoreHook := holdCoordAt(ctx, "prepared-all", release)
	defer restoreHook()
	var refusedOnce sync.Once
	defer node.SetMoveDoubtHook(func(int) { refusedOnce.Do(func() { close(release) }) })()
	xerr := make(chan error, 1)
	go func() { xerr <- xfer(ctx, owner, tbl, ids[0], ids[1], 10) }()
	<-holding

	_, mt := tc.openNodeTable(t, ctx, 0xd, "wb")
	require.NoError(t, mt.Move(ctx, 0, b), "the move waits out the transaction, then goes through")
	require.NoError(t, <-xerr, "the transaction commits")
	waitStep(t, resumed)

	require.NoError(t, tbl.Put(ctx, ids[2], acctRow(5, 0)), "acknowledged beside the moved partition, on its old storage node")
	require.NoError(t, owner.Close(ctx), "its flush at Close: nothing refused")
	got := make([]byte, 64)
	requireRow(t, ctx, mt, ids[2], got, acctRow(5, 0), "the write beside the moved partition is kept")
	requireRow(t, ctx, mt, ids[0], got, acctRow(initial-10, 0), "the transaction's rows were copied")
}

// A move keeps the acknowledged writes of a partition whose owning handle the game let go:
// the Node's list of handles is weak, so a collected handle is not among them, but the
// partition's table stays open in its storage node's transaction node, its writes in the
// cache; the owner's side flushes that table too (moveFlushTables). Found when a hostile
// review's test failed in a long run only (the GC had taken the handle): the request went
// unanswered and the move was refused after 10 s.
func TestMoveKeepsWritesOfACollectedHandle(t *testing.T) {
	ctx := testCtx(t)
	tc := startCluster(t, 2)
	owner := tc.openWriteBack(t, 0xa6)
	id := func() uint64 {
		tbl := createTable(t, ctx, owner, "wb", 64, 2, 1, tc.addrs)
		require.NoError(t, tbl.Own(ctx, 0))
		id := insertRow(t, ctx, tbl, balanceRow(1))
		require.NoError(t, tbl.Put(ctx, id, balanceRow(9)), "acknowledged, in the owner's cache only")
		return id
	}()
	_, err := owner.OpenTable(ctx, "wb") // the Node's latest handle is another (the first weak only)...
	require.NoError(t, err)
	mover, mt := tc.openNodeTable(t, ctx, 0xd, "wb")
	require.NoError(t, mt.Move(ctx, 1, tc.addrs[0]), "a move of the other partition changes the map")
	_, err = owner.OpenTable(ctx, "wb") // ... and this one replaces it: the first is collectable
	require.NoError(t, err)
	runtime.GC()
	runtime.GC()
	mt = openTable(t, ctx, mover, "wb")
	require.NoError(t, mt.Move(ctx, 0, tc.addrs[1]), "the owner flushed: the move goes through")
	got := make([]byte, 64)
	requireRow(t, ctx, mt, id, got, balanceRow(9), "the acknowledged write was copied")
}

// hearMoveFlush returns a channel that hears each time the owner's side of a move's flush
// takes step (moveflush.go's hook), for the test's length.
func hearMoveFlush(t *testing.T, step string) <-chan struct{} {
	t.Helper()
	ch := make(chan struct{}, 16)
	prev := moveFlushSteps.Load()
	hooks := map[string]chan struct{}{step: ch}
	if prev != nil {
		for k, v := range *prev {
			hooks[k] = v
		}
	}
	moveFlushSteps.Store(&hooks)
	if prev == nil {
		restore := node.SetMoveFlushHook(func(s string) {
			if m := moveFlushSteps.Load(); m != nil {
				if c, ok := (*m)[s]; ok {
					select {
					case c <- struct{}{}:
					default:
					}
				}
			}
		})
		t.Cleanup(func() { restore(); moveFlushSteps.Store(nil) })
	}
	return ch
}

var moveFlushSteps atomic.Pointer[map[string]chan struct{}]

// waitStep waits for one step heard on ch, bounded by the test's context.
func waitStep(t *testing.T, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-testCtx(t).Done():
		t.Fatal("the owner's step was never heard")
	}
}
