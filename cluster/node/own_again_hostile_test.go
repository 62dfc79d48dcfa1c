package node_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/txnode"
)

// Hostile review of owning a partition again (Table.Release, txncoord.Forget): each test
// is named after the defect it showed, fixed since (or after the attack that held).

// Release on a storage node whose transaction node died never succeeds: every other
// operation heals the transaction node first (Table.heal, Node.db: the next use replaces a
// dead one), Release does not. It forgets the table on the dead transaction node, whose
// Forget fails (ErrClosed), so the partition stays "still owned" (as Release's doc says of a
// failed transaction node) and its etcd grant held, but a retry fails the same way, for
// ever: another node cannot own the partition until this node's session ends, unless the
// game happens to read or write it meanwhile (which heals).
// Should: a retried Release succeed (healed, as Own heals; Durable: the dead node's
// acknowledged commits are on the storage node's WAL), and b own the partition. Does: every
// Release fails ("still owned"), and b's Own is refused naming a.
func TestReleaseOnDeadTransactionNodeNeverReleases(t *testing.T) {
	ctx := testCtx(t)
	tc := startCluster(t, 1)
	a := tc.openConfig(t, node.Config{Session: cluster.SessionConfig{Owner: 0xa, Addr: "game-a:7000", TTL: time.Hour}})
	b := tc.openConfig(t, node.Config{Session: cluster.SessionConfig{Owner: 0xb, Addr: "game-b:7000", TTL: time.Hour}})
	ta := createTable(t, ctx, a, "deadrel", 64, 1, 1, tc.addrs)
	tb := openTable(t, ctx, b, "deadrel")
	require.NoError(t, ta.Own(ctx, 0))
	x := insertRow(t, ctx, ta, balanceRow(1))
	require.NoError(t, ta.Put(ctx, x, balanceRow(2)))

	require.NoError(t, node.DieDB(ctx, a, ta.NodeOf(x)))
	if err := ta.Release(ctx, 0); err != nil { // documented: the transaction node failed
		t.Logf("the first Release: %v", err)
		require.Equal(t, node.OwnHeld, ta.OwnState(0))
	}
	for try := 0; ta.OwnState(0) == node.OwnHeld; try++ {
		err := ta.Release(ctx, 0)
		if try == 2 {
			require.NoError(t, err, "Release retried after the transaction node died")
		}
	}
	require.NoError(t, tb.Own(ctx, 0), "b owns the partition a released")
	dst := make([]byte, 64)
	requireBalance(t, ctx, tb, x, dst, 2, "a's acknowledged write")
}

// A scan of a partition another handle of the same Node released: Release forgets the
// partition's table (txnode.ErrForgotten), which every row call of the other handle counts
// as a lost grant (the partition dropped as owned, then read from the storage node's
// durable rows: Get), but Scan does not: it returns the error and leaves the partition
// listed as owned, so every later Scan of the handle fails the same way, for good. (Two
// handles of one table: OpenTable after a move of another partition changed the map.)
// Should: the scan read the released partition's durable rows, as Get does (a partition
// not owned is scanned from its storage node). Does: every ScanAll ends in an error
// wrapping txnode.ErrForgotten, and Owned still lists the partition.
func TestScanOfPartitionReleasedByOtherHandleFailsForGood(t *testing.T) {
	ctx := testCtx(t)
	tc := startCluster(t, 2)
	a := tc.open(t, 0xa, "game-a:7000")
	mover := tc.open(t, 0xb, "game-b:7000")
	t1, t2, _, x := secondHandle(t, ctx, tc, a, mover, "scanrel", 7)
	require.NoError(t, t1.Release(ctx, 0))

	for round := range 2 {
		var rows []uint64
		var err error
		for r, e := range t2.ScanAll(ctx) {
			if e != nil {
				err = e
				break
			}
			rows = append(rows, r.ID)
		}
		if errors.Is(err, txnode.ErrForgotten) {
			t.Errorf("round %d: the scan failed (%v); the handle still lists as owned %v", round, err, t2.Owned())
			continue
		}
		require.NoError(t, err, "round %d", round)
		require.Equal(t, []uint64{x}, rows, "round %d", round)
	}
	dst := make([]byte, 64)
	require.NoError(t, t2.Get(ctx, x, dst), "Get reads it")
	require.EqualValues(t, 7, balanceOf(dst))
}

// A Release through one handle while another handle of the same Node has the partition
// OwnMoving (a write of it found the source frozen by a move: to be owned again once the
// move's switch is followed) gives the grant up (the owner key deleted), but the other
// handle's follow of the switch then acquires the partition again under a new grant, as
// if nothing had been released: the Node owns the partition the game released, and
// another node's Own fails naming it. Release says the grant is the Node's: another handle
// that owns the partition loses it too (OwnLost).
// Should: after the move, t1 not own partition 0 (OwnLost) and b own it. Does: t1 owns it
// again (OwnHeld) under a new owner key, and b's Own is refused naming a.
func TestReleaseByOtherHandleReownedByMovingHandle(t *testing.T) {
	ctx := testCtx(t)
	tc := startCluster(t, 2)
	a := tc.open(t, 0xa, "game-a:7000")
	b := tc.open(t, 0xb, "game-b:7000")
	mover := tc.open(t, 0xc, "")
	t1, t2, mt, x := secondHandle(t, ctx, tc, a, mover, "relmov", 1)

	thaw, moved := freezeHold(t, ctx, mt, 0, tc.addrs[1])
	require.ErrorIs(t, t1.Put(ctx, x, balanceRow(2)), node.ErrNotOwner, "the frozen source refuses the write")
	require.Equal(t, node.OwnMoving, t1.OwnState(0))
	require.NoError(t, t2.Release(ctx, 0), "the game gives partition 0 up")
	_, held := tc.holder(t, ctx, "relmov", 0)
	require.False(t, held, "released")
	close(thaw)
	require.NoError(t, <-moved)

	tb := openTable(t, ctx, b, "relmov")
	dst := make([]byte, 64)
	require.NoError(t, t1.Get(ctx, x, dst)) // t1 follows the switch
	require.Equal(t, tc.addrs[1], t1.NodeOf(x))
	h, held := tc.holder(t, ctx, "relmov", 0)
	assert.False(t, held, "a re-acquired the partition it released: holder %+v; t1 %v", h, t1.OwnState(0))
	require.NoError(t, tb.Own(ctx, 0), "b owns the partition a released")
}

// Own through a handle that still holds the table state another handle of the same Node
// released (forgotten: txnode.ErrForgotten; the grant given up) is a no-op: own skips every
// partition whose table is set, without asking whether it still serves, so Own returns nil
// while the Node owns nothing, and the next write fails with a *NotOwnerError (nobody holds
// the partition). Should: Own take the partition again (a new grant), and the Put succeed.
// Does: Own returns nil, nobody holds the partition, and the Put fails with ErrNotOwner.
func TestOwnAfterReleaseByOtherHandleIsNoOp(t *testing.T) {
	ctx := testCtx(t)
	tc := startCluster(t, 2)
	a := tc.open(t, 0xa, "game-a:7000")
	mover := tc.open(t, 0xc, "")
	t1, t2, _, x := secondHandle(t, ctx, tc, a, mover, "ownnoop", 1)
	require.NoError(t, t2.Release(ctx, 0))

	require.NoError(t, t1.Own(ctx, 0), "the game owns partition 0 again through t1")
	_, held := tc.holder(t, ctx, "ownnoop", 0)
	assert.True(t, held, "Own returned nil: the Node holds the partition")
	require.NoError(t, t1.Put(ctx, x, balanceRow(2)), "a write after Own")
}

// Regression guard (held in this review): a WriteBack Release cut short at every point by
// its context's deadline either keeps the partition owned and usable (the forget's flush
// did not finish: nothing forgotten), or releases it here (its owner key kept when etcd's
// release did not finish: Own takes it again under it); either way every acknowledged
// write is read by the next owner.
func TestReleaseCutShortKeepsEveryAckedWrite(t *testing.T) {
	ctx := testCtx(t)
	tc := startCluster(t, 1)
	a := tc.openWriteBack(t, 0xa)
	b := tc.openWriteBack(t, 0xb)
	ta := createTable(t, ctx, a, "reldl", 64, 1, 1, tc.addrs)
	tb := openTable(t, ctx, b, "reldl")
	require.NoError(t, ta.Own(ctx, 0))
	x := insertRow(t, ctx, ta, balanceRow(1))
	v := uint64(1)
	dst := make([]byte, 64)
	for i := range 40 {
		v++
		require.NoError(t, ta.Put(ctx, x, balanceRow(v)))
		rctx, cancel := context.WithTimeout(ctx, time.Duration(i*50)*time.Microsecond)
		err := ta.Release(rctx, 0)
		cancel()
		if err != nil && ta.OwnState(0) == node.OwnReleased {
			require.NoError(t, ta.Own(ctx, 0), "i=%d: a owns again under its kept key", i)
			requireBalance(t, ctx, ta, x, dst, v, "i=%d", i)
			require.NoError(t, ta.Release(ctx, 0))
		} else if err != nil {
			require.Equal(t, node.OwnHeld, ta.OwnState(0), "i=%d %v", i, err)
			require.NoError(t, ta.Get(ctx, x, dst), "i=%d after %v", i, err)
			require.Equal(t, v, balanceOf(dst))
			v++
			require.NoError(t, ta.Put(ctx, x, balanceRow(v)), "i=%d after %v", i, err)
			require.NoError(t, ta.Release(ctx, 0))
		}
		require.NoError(t, tb.Own(ctx, 0), "i=%d", i)
		requireBalance(t, ctx, tb, x, dst, v, "i=%d", i)
		require.NoError(t, tb.Release(ctx, 0))
		require.NoError(t, ta.Own(ctx, 0))
	}
}

// Regression guard (held in this review): writes of a WriteBack owner running while its
// Release forgets the partition are either acknowledged and then read by the next owner,
// or refused: the last acknowledged one is what b reads, in every round.
func TestReleaseDuringWritesKeepsAckedWrites(t *testing.T) {
	ctx := testCtx(t)
	tc := startCluster(t, 1)
	a := tc.openWriteBack(t, 0xa)
	b := tc.openWriteBack(t, 0xb)
	ta := createTable(t, ctx, a, "relw", 64, 1, 1, tc.addrs)
	tb := openTable(t, ctx, b, "relw")
	require.NoError(t, ta.Own(ctx, 0))
	x := insertRow(t, ctx, ta, balanceRow(0))
	dst := make([]byte, 64)
	var v uint64
	for round := range 8 {
		acked := make(chan uint64, 1)
		started := make(chan struct{})
		go func() {
			last := v
			for n := v + 1; ; n++ {
				if err := ta.Put(ctx, x, balanceRow(n)); err != nil {
					acked <- last
					return
				}
				last = n
				if n == v+3 {
					close(started)
				}
			}
		}()
		select {
		case <-started:
		case last := <-acked:
			require.FailNow(t, "a's writes failed before its Release", "round %d, last %d", round, last)
		}
		require.NoError(t, ta.Release(ctx, 0))
		v = <-acked
		require.NoError(t, tb.Own(ctx, 0), "round %d", round)
		requireBalance(t, ctx, tb, x, dst, v, "round %d: the last write a acknowledged", round)
		require.NoError(t, tb.Release(ctx, 0))
		require.NoError(t, ta.Own(ctx, 0))
	}
}

// Regression guard (held in this review): a Release of a partition with a two-phase commit
// prepared on it (docs/cluster.md, "Owning again, the edges": not waited for), at the
// coordinator's steps once both parts are prepared (before their validation), after the
// validation, and after the decision: the transaction commits or
// aborts as a whole, and the next owner (whose registration waits for the part to be
// settled) reads its outcome.
func TestReleaseDuringTwoPhaseCommitNextOwnerReadsOutcome(t *testing.T) {
	for _, at := range []string{"prepared", "prepared-all", "decided"} {
		t.Run(at, func(t *testing.T) {
			ctx := testCtx(t)
			tc := startCluster(t, 2)
			a := tc.open(t, 0xa, "game-a:7000")
			b := tc.open(t, 0xb, "game-b:7000")
			ta := createTable(t, ctx, a, "rel2pc", 64, 2, 1, tc.addrs)
			tb := openTable(t, ctx, b, "rel2pc")
			x, y := ownTwoRows(t, ctx, ta)
			require.NotEqual(t, ta.NodeOf(x), ta.NodeOf(y))
			// The hook runs on each part's goroutine: fired once, atomically.
			var fired atomic.Bool
			relErr := make(chan error, 1)
			defer node.SetCoordHook(func(step string, i int) {
				if step != at || step == "prepared" && i != 2 || !fired.CompareAndSwap(false, true) {
					return
				}
				relErr <- ta.Release(ctx, 0)
			})()
			uerr := a.Update(ctx, func(tx *node.Tx) error {
				if err := tx.Put(ta, x, balanceRow(2)); err != nil {
					return err
				}
				return tx.Put(ta, y, balanceRow(2))
			})
			require.True(t, fired.Load(), "a two-phase commit")
			require.NoError(t, <-relErr)
			require.NoError(t, tb.Own(ctx, 0))
			dst := make([]byte, 64)
			require.NoError(t, tb.Get(ctx, x, dst))
			got := balanceOf(dst)
			require.NoError(t, ta.Get(ctx, y, dst))
			if uerr == nil {
				require.EqualValues(t, 2, got, "committed: x's new value")
				require.EqualValues(t, 2, balanceOf(dst))
			} else {
				require.EqualValues(t, 1, got, "not committed (%v): x's old value", uerr)
				require.EqualValues(t, 1, balanceOf(dst))
			}
			t.Logf("%s: update %v", at, uerr)
		})
	}
}

// A heal of a storage node's transaction node (heal.go: reown) re-acquires a partition
// another handle of the same Node released: reown registers again every partition a live
// handle still holds a table of, and the first handle still holds the table state the
// Release forgot (it has not used it since), so reown takes a new grant (the session no
// longer holds one) and the Node owns the partition the game gave up.
// Should: after the heal nobody hold partition 0, and b own it. Does: a holds it again (a
// new owner key), and b's Own is refused naming a.
func TestHealReacquiresPartitionReleasedByOtherHandle(t *testing.T) {
	ctx := testCtx(t)
	tc := startCluster(t, 2)
	a := tc.open(t, 0xa, "game-a:7000")
	b := tc.open(t, 0xb, "game-b:7000")
	mover := tc.open(t, 0xc, "")
	t1, t2, _, x := secondHandle(t, ctx, tc, a, mover, "healrel", 1)
	require.NoError(t, t2.Release(ctx, 0), "the game gives partition 0 up")
	_, held := tc.holder(t, ctx, "healrel", 0)
	require.False(t, held)

	require.NoError(t, node.DieDB(ctx, a, tc.addrs[0]))
	dst := make([]byte, 64)
	var err error
	for try := 0; try < 3; try++ { // the first read finds the dead transaction node, a later one heals it
		if err = t2.Get(ctx, x, dst); err == nil {
			break
		}
	}
	require.NoError(t, err, "reads work again once healed")
	h, held := tc.holder(t, ctx, "healrel", 0)
	assert.False(t, held, "the heal re-acquired the released partition: holder %+v, t1 %v", h, t1.OwnState(0))
	tb := openTable(t, ctx, b, "healrel")
	require.NoError(t, tb.Own(ctx, 0), "b owns the partition a released")
}

// A move's follow (follow.go: movedOn) re-acquires, at the target, a partition another
// handle of the same Node released: the first handle still holds the table state the
// Release forgot (unused since), movedOn takes it for an owned partition and registers the
// session's grant at the target, a new one since the session holds none, so the Node owns
// the partition the game gave up. (TestReleaseByOtherHandleReownedByMovingHandle is the
// same through a handle that found the move first, OwnMoving.)
// Should: after the move nobody hold partition 0. Does: a holds it again.
func TestFollowReacquiresPartitionReleasedByOtherHandle(t *testing.T) {
	ctx := testCtx(t)
	tc := startCluster(t, 2)
	a := tc.open(t, 0xa, "game-a:7000")
	mover := tc.open(t, 0xc, "")
	t1, t2, mt, x := secondHandle(t, ctx, tc, a, mover, "followrel", 1)
	require.NoError(t, t2.Release(ctx, 0), "the game gives partition 0 up")

	require.NoError(t, mt.Move(ctx, 0, tc.addrs[1]))
	require.NoError(t, node.SyncMap(ctx, a))
	dst := make([]byte, 64)
	require.NoError(t, t1.Get(ctx, x, dst)) // t1 follows the switch
	require.Equal(t, tc.addrs[1], t1.NodeOf(x))
	h, held := tc.holder(t, ctx, "followrel", 0)
	require.False(t, held, "the follow re-acquired the released partition: holder %+v, t1 %v", h, t1.OwnState(0))
}

// Regression guard (held in this review): a handle that did nothing while its partition
// moved away and back reads, after the move back, what another handle of the same Node
// wrote at the other storage node meanwhile, not the rows it cached before the first move
// (its table state on the first storage node is forgotten: another table id there now).
func TestIdleHandleAfterMoveAwayAndBackReadsOtherHandlesWrite(t *testing.T) {
	ctx := testCtx(t)
	tc := startCluster(t, 2)
	a := tc.open(t, 0xa, "game-a:7000")
	mover := tc.open(t, 0xc, "")
	t1 := createTable(t, ctx, a, "idleback", 64, 2, 1, tc.addrs)
	require.NoError(t, t1.Own(ctx, 0))
	x := insertRow(t, ctx, t1, balanceRow(1))
	require.EqualValues(t, 0, t1.Partition(x))
	dst := make([]byte, 64)
	require.NoError(t, t1.Get(ctx, x, dst)) // cached at the first storage node
	mt := openTable(t, ctx, mover, "idleback")
	require.NoError(t, mt.Move(ctx, 0, tc.addrs[1]))
	t2 := openTable(t, ctx, a, "idleback")
	require.NotSame(t, t1, t2)
	require.NoError(t, t2.Own(ctx, 0))
	var err error
	for try := 0; try < 10; try++ {
		if err = t2.Put(ctx, x, balanceRow(2)); err == nil {
			break
		}
	}
	require.NoError(t, err)
	require.NoError(t, mt.Move(ctx, 0, tc.addrs[0]))
	require.NoError(t, t1.Get(ctx, x, dst)) // whatever the node's map watcher has seen yet
	require.EqualValues(t, 2, balanceOf(dst), "t2's write at the other storage node")
}

// secondHandle gives node a two handles of table name (64-byte rows, two partitions placed
// over tc's storage nodes): t1 creates it, owns partition 0 and inserts row x of balance v
// there; mover's handle mt moves partition 1 to the first storage node, so the map changes
// and a's OpenTable returns a second handle, t2, which owns partition 0 too.
func secondHandle(t *testing.T, ctx context.Context, tc *testCluster, a, mover *node.Node, name string, v uint64) (t1, t2, mt *node.Table, x uint64) {
	t.Helper()
	t1 = createTable(t, ctx, a, name, 64, 2, 1, tc.addrs)
	require.NoError(t, t1.Own(ctx, 0))
	x = insertRow(t, ctx, t1, balanceRow(v))
	require.EqualValues(t, 0, t1.Partition(x))
	mt = openTable(t, ctx, mover, name)
	require.NoError(t, mt.Move(ctx, 1, tc.addrs[0])) // the map changes: a second handle
	t2 = openTable(t, ctx, a, name)
	require.NotSame(t, t1, t2)
	require.NoError(t, t2.Own(ctx, 0))
	return t1, t2, mt, x
}
