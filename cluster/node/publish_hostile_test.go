package node_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/txnode"
)

// Hostile review of publish.go (61b3734): every handle stores a partition's owned table
// through Node.publish, which supersedes (txncoord.Supersede, for good) the table published
// before. The attacks look for a table superseded while it is in fact the one serving the
// partition: every transaction that reads it then fails its validation (ErrConflict) for
// ever, and nothing but a Release and a new Own gives the partition back to the game.
// Each test is named after what it shows; DEFECT marks the ones failing at 61b3734.

// bumpRetry adds one to row x of tbl in an Update of n, run again while it fails as
// not-owner or conflict (a move's refusals are documented as retryable), a bounded number
// of times; it returns the last error.
func bumpRetry(ctx context.Context, n *node.Node, tbl *node.Table, x uint64) error {
	return updateRetry(ctx, n, func(tx *node.Tx) error {
		return tx.Update(tbl, x, func(row []byte) error {
			copy(row, balanceRow(balanceOf(row)+1))
			return nil
		})
	})
}

// viewOf reads row x of tbl in a View of n (retried as bumpRetry).
func viewOf(ctx context.Context, n *node.Node, tbl *node.Table, x uint64) (uint64, error) {
	var v uint64
	var err error
	for range 50 {
		var ne *node.NotOwnerError
		err = n.View(ctx, func(tx *node.Tx) error {
			dst := make([]byte, 64)
			if err := tx.Get(tbl, x, dst); err != nil {
				return err
			}
			v = balanceOf(dst)
			return nil
		})
		if err == nil || !errors.As(err, &ne) && !errors.Is(err, txnode.ErrConflict) {
			break
		}
	}
	return v, err
}

// onceAt sets the race hook to run f the first time the race point where is reached (f may
// itself pass race points: they do not run it again); it returns what reports whether f ran.
func onceAt(t *testing.T, where string, f func()) (fired func() bool) {
	t.Helper()
	done := false
	t.Cleanup(node.SetRaceHook(func(w string) {
		if w == where && !done {
			done = true
			f()
		}
	}))
	return func() bool { return done }
}

// DEFECT (livelock). Own publishes the table it took only after its grants' map check, at
// the end (the "own" race point), last writer wins: nothing checks that what it publishes
// is still the partition's table. Two handles t1, t2 of one Node (OpenTable after the map
// changed): t1's Own of partition 0 took the table state S1; before it publishes, t2 owns
// the partition too (a handle of S1), releases it (S1 forgotten, the grant gone) and owns it
// again (a new grant, a new state S2, published). Then t1 publishes S1: S2, the very table
// serving the partition, is marked superseded for good. Every transaction through t2 that
// reads the partition fails its validation (ErrConflict) from then on, after all its
// retries, and so does t1's once it owns again (Own of an owned partition is a no-op; an
// Own afresh gets S2 again, a handle of the superseded state). Should: a publish never
// supersede a table published after the one it replaces (publish only what is still the
// partition's table: compare with the one it was taken over, or refuse a forgotten table),
// and the game's transactions on the partition commit. Does: ErrConflict for ever.
func TestHostileOwnRacingReleaseAndOwnOfOtherHandleLeavesPartitionWritable(t *testing.T) {
	ctx := testCtx(t)
	tc := startTxnCluster(t, 2, nil)
	a := tc.open(t, 0xa, "game-a:7000")
	mover := tc.open(t, 0xc, "")
	t1, t2, _, x := secondHandle(t, ctx, tc, a, mover, "ownrace", 5)
	require.NoError(t, t1.Release(ctx, 0)) // neither handle owns partition 0 now
	require.Equal(t, node.OwnLost, t2.OwnState(0))

	fired := onceAt(t, "own", func() {
		// t1's Own has its table, not published yet.
		require.NoError(t, t2.Own(ctx, 0))
		require.NoError(t, t2.Release(ctx, 0))
		require.NoError(t, t2.Own(ctx, 0))
	})
	require.NoError(t, t1.Own(ctx, 0))
	require.True(t, fired())
	require.Equal(t, node.OwnHeld, t2.OwnState(0))

	// Outside a transaction too (txnode's own Update of the row: its lease check).
	assert.NoError(t, t2.Put(ctx, x, balanceRow(5)), "Table.Put through the owning handle")
	_, ierr := t2.Insert(ctx, balanceRow(0))
	assert.NoError(t, ierr, "Table.Insert through the owning handle")
	require.NoError(t, bumpRetry(ctx, a, t2, x),
		"a transaction through the handle that owns the partition (its table superseded by t1's late publish)")
	if t1.OwnState(0) != node.OwnHeld {
		require.NoError(t, t1.Own(ctx, 0))
	}
	require.NoError(t, bumpRetry(ctx, a, t1, x), "a transaction through t1, owning again")
	v, err := viewOf(ctx, a, t2, x)
	require.NoError(t, err)
	require.EqualValues(t, 7, v)
}

// DEFECT (livelock). The same late publish with a move instead of a Release: t2 owns
// partition 0 (table S1 on the first storage node); t1's Own of it takes a handle of S1 and,
// before it publishes, the partition moves to the second storage node and t2 follows the
// switch (its table there, S2, published, S1 superseded). t1 then publishes S1, which
// marks S2 superseded: every transaction reading the partition, through t2 or through t1
// (whose follow finds S2 again on the target: a handle of the superseded state), fails with
// ErrConflict for ever. Should: the partition's transactions commit after the move (t1's
// Own either fails with ErrMapChanged or publishes nothing over a newer table). Does:
// ErrConflict after every retry.
func TestHostileOwnRacingMoveFollowedByOtherHandleLeavesPartitionWritable(t *testing.T) {
	ctx := testCtx(t)
	tc := startTxnCluster(t, 2, nil)
	a := tc.open(t, 0xa, "game-a:7000")
	mover := tc.open(t, 0xc, "")
	t1, t2, mt, x := secondHandle(t, ctx, tc, a, mover, "ownmove", 5)
	require.NoError(t, t1.Release(ctx, 0))
	require.NoError(t, t2.Own(ctx, 0)) // t2 owns partition 0 again; t1 does not

	dst := make([]byte, 64)
	fired := onceAt(t, "own", func() {
		require.NoError(t, mt.Move(ctx, 0, tc.addrs[1]))
		require.NoError(t, node.SyncMap(ctx, a))
		require.NoError(t, t2.Get(ctx, x, dst)) // t2 follows the switch: its target table published
		require.Equal(t, tc.addrs[1], t2.NodeOf(x))
		require.Equal(t, node.OwnHeld, t2.OwnState(0))
	})
	if err := t1.Own(ctx, 0); err != nil {
		t.Logf("t1's Own racing the move: %v", err) // refusing it is fine
	}
	require.True(t, fired())

	require.NoError(t, bumpRetry(ctx, a, t2, x),
		"a transaction through the handle that followed the move (its table superseded by t1's late publish)")
	v, err := viewOf(ctx, a, t2, x)
	require.NoError(t, err)
	require.EqualValues(t, 6, v)
}

// Regression guard: a partition moved away and back, its owner transacting after each move
// (its follow publishes the target's table, then the fresh copy's on the first storage node:
// the state it kept there is forgotten, another table id), keeps committing; and a second
// handle of the same Node that did nothing across both moves transacts too (its follow finds
// the current state: a handle of it, no supersede).
func TestHostileMoveAwayAndBackTransactionsCommitThroughEveryHandle(t *testing.T) {
	eachDurability(t, func(t *testing.T, d txnode.Durability) {
		ctx := testCtx(t)
		tc := startTxnCluster(t, 2, nil)
		a := tc.openConfig(t, node.Config{Session: cluster.SessionConfig{Owner: 0xa, Addr: "game-a:7000"}, Durability: d})
		mover := tc.open(t, 0xc, "")
		t1, t2, mt, x := secondHandle(t, ctx, tc, a, mover, "awayback", 0)
		require.NoError(t, bumpRetry(ctx, a, t2, x))

		require.NoError(t, mt.Move(ctx, 0, tc.addrs[1]))
		require.NoError(t, bumpRetry(ctx, a, t1, x), "after the move away")
		require.NoError(t, mt.Move(ctx, 0, tc.addrs[0]))
		require.NoError(t, bumpRetry(ctx, a, t1, x), "after the move back")
		require.NoError(t, bumpRetry(ctx, a, t2, x), "through the handle idle across both moves")
		// One transaction through both handles.
		require.NoError(t, updateRetry(ctx, a, func(tx *node.Tx) error {
			dst := make([]byte, 64)
			if err := tx.Get(t1, x, dst); err != nil {
				return err
			}
			return tx.Put(t2, x, balanceRow(balanceOf(dst)+1))
		}))
		v, err := viewOf(ctx, a, t1, x)
		require.NoError(t, err)
		require.EqualValues(t, 5, v)
	})
}

// Regression guard: the owner idle across a move away and back (its first operation after
// both follows two switches at once) transacts at once.
func TestHostileIdleOwnerAfterMoveAwayAndBackCommits(t *testing.T) {
	ctx := testCtx(t)
	tc := startTxnCluster(t, 2, nil)
	a := tc.open(t, 0xa, "game-a:7000")
	mover := tc.open(t, 0xc, "")
	ta := createTable(t, ctx, a, "idleab", 64, 1, 1, tc.addrs[:1])
	require.NoError(t, ta.Own(ctx, 0))
	x := insertRow(t, ctx, ta, balanceRow(0))
	require.NoError(t, bumpRetry(ctx, a, ta, x))
	mt := openTable(t, ctx, mover, "idleab")
	require.NoError(t, mt.Move(ctx, 0, tc.addrs[1]))
	require.NoError(t, mt.Move(ctx, 0, tc.addrs[0]))
	require.NoError(t, bumpRetry(ctx, a, ta, x))
	require.NoError(t, bumpRetry(ctx, a, ta, x))
	v, err := viewOf(ctx, a, ta, x)
	require.NoError(t, err)
	require.EqualValues(t, 3, v)
}

// Regression guard: a move whose mover gave up once the source was frozen, after the
// owner's write found the frozen source (OwnMoving: its table dropped, to rejoin at the
// switch), and which the operator's next Move to the same target takes over and completes:
// the owner's follow publishes the target's table, and its transactions commit.
func TestHostileMoveCutShortAtFreezeThenResumedCommits(t *testing.T) {
	ctx := testCtx(t)
	tc := startTxnCluster(t, 2, nil)
	a := tc.open(t, 0xa, "game-a:7000")
	mover := tc.open(t, 0xc, "")
	ta := createTable(t, ctx, a, "resumed", 64, 1, 1, tc.addrs[:1])
	require.NoError(t, ta.Own(ctx, 0))
	x := insertRow(t, ctx, ta, balanceRow(0))
	mt := openTable(t, ctx, mover, "resumed")

	mctx, cancel := context.WithCancel(ctx)
	defer cancel()
	node.SetMoveStepHook(func(s string) {
		if s == node.MoveStepFrozen {
			// The owner writes into the frozen source: refused, the partition moving.
			var ne *node.NotOwnerError
			require.ErrorAs(t, ta.Put(ctx, x, balanceRow(9)), &ne)
			cancel() // the mover gives up
		}
	})
	t.Cleanup(func() { node.SetMoveStepHook(nil) })
	require.Error(t, mt.Move(mctx, 0, tc.addrs[1]))
	node.SetMoveStepHook(nil)
	require.Equal(t, node.OwnMoving, ta.OwnState(0))

	require.NoError(t, mt.Move(ctx, 0, tc.addrs[1]), "the recorded move taken over")
	require.NoError(t, bumpRetry(ctx, a, ta, x))
	require.NoError(t, bumpRetry(ctx, a, ta, x))
	require.Equal(t, tc.addrs[1], ta.NodeOf(x))
	v, err := viewOf(ctx, a, ta, x)
	require.NoError(t, err)
	require.EqualValues(t, 2, v)
}

// Regression guard: a table dropped and created again under the same name (publish keys by
// name and partition) is owned and transacted on by a new handle: the old table's state on
// the storage node is forgotten (another table id), the new one published over it.
func TestHostileDroppedAndRecreatedTableCommits(t *testing.T) {
	ctx := testCtx(t)
	tc := startTxnCluster(t, 1, nil)
	a := tc.open(t, 0xa, "game-a:7000")
	old := createTable(t, ctx, a, "again", 64, 1, 1, tc.addrs)
	require.NoError(t, old.Own(ctx, 0))
	x := insertRow(t, ctx, old, balanceRow(0))
	require.NoError(t, bumpRetry(ctx, a, old, x))
	require.NoError(t, tc.c.DropTable(ctx, "again"))
	require.NoError(t, node.SyncMap(ctx, a))
	// Its partition table dropped at the storage node too (as CreateTable asks).
	require.NoError(t, tc.srvs[0].Engine().DropTable(base.PartitionTableName("again", 0), 0xa))

	fresh := createTable(t, ctx, a, "again", 64, 1, 1, tc.addrs)
	require.NoError(t, fresh.Own(ctx, 0))
	y := insertRow(t, ctx, fresh, balanceRow(0))
	require.NoError(t, bumpRetry(ctx, a, fresh, y))
	require.NoError(t, bumpRetry(ctx, a, fresh, y))
	v, err := viewOf(ctx, a, fresh, y)
	require.NoError(t, err)
	require.EqualValues(t, 2, v)
	// The old handle fails as dropped, whatever it did before.
	err = a.Update(ctx, func(tx *node.Tx) error { return tx.Put(old, x, balanceRow(1)) })
	require.Error(t, err)
}

// Regression guard: a heal of the transaction node after a move away and back (its reown
// publishes the new transaction node's table over the fresh copy's) leaves the partition's
// transactions committing, through the handle that moved and the one idle throughout.
func TestHostileHealAfterMoveAwayAndBackCommits(t *testing.T) {
	ctx := testCtx(t)
	tc := startTxnCluster(t, 2, nil)
	a := tc.open(t, 0xa, "game-a:7000")
	mover := tc.open(t, 0xc, "")
	t1, t2, mt, x := secondHandle(t, ctx, tc, a, mover, "healab", 0)
	require.NoError(t, mt.Move(ctx, 0, tc.addrs[1]))
	require.NoError(t, bumpRetry(ctx, a, t1, x))
	require.NoError(t, mt.Move(ctx, 0, tc.addrs[0]))
	require.NoError(t, bumpRetry(ctx, a, t1, x))
	require.NoError(t, node.KillDB(ctx, a, tc.addrs[0]))
	require.NoError(t, bumpRetry(ctx, a, t2, x), "through the idle handle after the heal")
	require.NoError(t, bumpRetry(ctx, a, t1, x), "through the moving handle after the heal")
	v, err := viewOf(ctx, a, t1, x)
	require.NoError(t, err)
	require.EqualValues(t, 4, v)
}

// Regression guard: the same race on one handle: its Own of partition 0 has its table at
// the first storage node when the partition moves and the handle itself follows the switch
// (its route the target's, no table to carry over yet). Own then finds the route's
// transaction node is not its table's and owns the partition on the target instead: the
// handle's transactions and writes commit.
func TestHostileOwnRacingMoveFollowedBySameHandleLeavesPartitionWritable(t *testing.T) {
	ctx := testCtx(t)
	tc := startTxnCluster(t, 2, nil)
	a := tc.open(t, 0xa, "game-a:7000")
	mover := tc.open(t, 0xc, "")
	ta := createTable(t, ctx, a, "ownself", 64, 1, 1, tc.addrs[:1])
	require.NoError(t, ta.Own(ctx, 0))
	x := insertRow(t, ctx, ta, balanceRow(0))
	require.NoError(t, ta.Release(ctx, 0))
	mt := openTable(t, ctx, mover, "ownself")

	dst := make([]byte, 64)
	fired := onceAt(t, "own", func() {
		require.NoError(t, mt.Move(ctx, 0, tc.addrs[1]))
		require.NoError(t, node.SyncMap(ctx, a))
		require.NoError(t, ta.Get(ctx, x, dst)) // follows: routed to the target, nothing owned yet
		require.Equal(t, tc.addrs[1], ta.NodeOf(x))
	})
	if err := ta.Own(ctx, 0); err != nil {
		t.Logf("Own racing the move: %v", err)
		require.NoError(t, ta.Own(ctx, 0))
	}
	require.True(t, fired())
	require.NoError(t, bumpRetry(ctx, a, ta, x))
	var err error
	for try := 0; try < 10; try++ {
		if err = ta.Put(ctx, x, balanceRow(5)); err == nil {
			break
		}
	}
	require.NoError(t, err)
	v, err := viewOf(ctx, a, ta, x)
	require.NoError(t, err)
	require.EqualValues(t, 5, v)
}
