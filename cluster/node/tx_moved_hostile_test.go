package node_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/txnode"
)

// Hostile review of "a validation counts only where the partition is still served"
// (9976392): a transaction whose reads were validated in an owned table replaced by a move
// must not commit. The write skew below is the check: two transactions each read both
// "on call" rows x and y and, seeing both set, clear their own one. Run serially, exactly one
// of them clears its row; both cleared is a cycle (each read the row the other wrote before
// it was written): not serializable.

// onCall is the row of an on-call flag (1 set, 0 cleared).
func onCall(v uint64) []byte { return balanceRow(v) }

// clearIfBoth is the write-skew transaction body: it reads x and y and, when both are set,
// clears mine (x or y). between, when set, runs once both are read and before the write.
func clearIfBoth(tx *node.Tx, t *node.Table, x, y, mine uint64, between func()) error {
	f, g, err := getPair(tx, t, x, y)
	if err != nil {
		return err
	}
	if between != nil {
		between()
	}
	if balanceOf(f) == 1 && balanceOf(g) == 1 {
		return tx.Put(t, mine, onCall(0))
	}
	return nil
}

// updateRetry runs fn in n.Update again while it fails as not-owner or conflict (a partition
// being switched: documented as retryable), a bounded number of times.
func updateRetry(ctx context.Context, n *node.Node, fn func(tx *node.Tx) error) error {
	var err error
	for range 50 {
		var ne *node.NotOwnerError
		err = n.Update(ctx, fn)
		if err == nil || !errors.As(err, &ne) && !errors.Is(err, txnode.ErrConflict) {
			return err
		}
	}
	return err
}

// flags reads x and y in one View of n.
func flags(t *testing.T, ctx context.Context, n *node.Node, tbl *node.Table, x, y uint64) (fx, fy uint64) {
	t.Helper()
	var err error
	for range 50 {
		var ne *node.NotOwnerError
		err = n.View(ctx, func(tx *node.Tx) error {
			f, g, err := getPair(tx, tbl, x, y)
			fx, fy = balanceOf(f), balanceOf(g)
			return err
		})
		if err == nil || !errors.As(err, &ne) {
			break
		}
	}
	require.NoError(t, err)
	return fx, fy
}

// twoFlagsOnOneNode opens node 0xa (durability d) on a 2-storage-node transaction cluster,
// creates "oncall" with two partitions both on the first storage node, owns both and inserts
// a set flag in each: x in partition 0, y in partition 1. It returns a mover handle too.
func twoFlagsOnOneNode(t *testing.T, ctx context.Context, d txnode.Durability) (tc *testCluster, a *node.Node, ta, mt *node.Table, x, y uint64) {
	t.Helper()
	tc = startTxnCluster(t, 2, nil)
	a = tc.openConfig(t, node.Config{Session: cluster.SessionConfig{Owner: 0xa, Addr: "game-a:7000"}, Durability: d})
	ta = createTable(t, ctx, a, "oncall", 64, 2, 1, tc.addrs[:1])
	require.NoError(t, ta.Own(ctx, 0, 1))
	for x == 0 || y == 0 {
		id := insertRow(t, ctx, ta, onCall(1))
		switch ta.Partition(id) {
		case 0:
			x = id
		case 1:
			y = id
		}
	}
	require.Equal(t, ta.NodeOf(x), ta.NodeOf(y), "both flags on one storage node")
	mover := tc.open(t, 0xb, "")
	mt = openTable(t, ctx, mover, "oncall")
	return tc, a, ta, mt, x, y
}

// DEFECT. A one-batch commit that wrote is not checked (tx.commit: "its storage node took the
// batch, so the partition was not moved yet"). That holds for the partitions it WROTE, not
// for the ones it only READ on the same storage node: T1 reads x (partition 0) and y
// (partition 1), both on storage node S0; partition 0 moves to S1 and T2 clears x there
// (reading y); T1 then clears y and commits as one batch on S0: x's read is validated in
// S0's old owned table of partition 0, which nothing writes any more, and passes. Both flags
// end cleared. What should happen: T1's commit fails with txnode.ErrConflict (stillServed
// for every touched partition, written or not, also in the one-batch case) and Update runs
// it again: it then sees x cleared and leaves y set.
func TestHostileOneBatchCommitReadOfMovedPartitionIsChecked(t *testing.T) {
	for _, d := range []struct {
		name string
		d    txnode.Durability
	}{{"durable", txnode.Durable}, {"writeback", txnode.WriteBack}} {
		t.Run(d.name, func(t *testing.T) {
			ctx := testCtx(t)
			tc, a, ta, mt, x, y := twoFlagsOnOneNode(t, ctx, d.d)
			attempts := 0
			err := a.Update(ctx, func(tx *node.Tx) error {
				attempts++
				return clearIfBoth(tx, ta, x, y, y, func() {
					if attempts != 1 {
						return
					}
					// Between T1's reads and its write: x's partition moves to S1 and T2
					// clears x there (T2 read y on S0: two-phase, x's part the primary).
					require.NoError(t, mt.Move(ctx, 0, tc.addrs[1]))
					require.NoError(t, updateRetry(ctx, a, func(tx *node.Tx) error {
						return clearIfBoth(tx, ta, x, y, x, nil)
					}))
				})
			})
			require.NoError(t, err)
			require.Equal(t, tc.addrs[1], ta.NodeOf(x), "x moved")
			require.NotEqual(t, ta.NodeOf(x), ta.NodeOf(y))
			fx, fy := flags(t, ctx, a, ta, x, y)
			require.Equal(t, uint64(0), fx, "T2 cleared x")
			require.Equal(t, uint64(1), fy, "write skew: T1 cleared y on a read of x validated at the source's old owned table (attempts %d)", attempts)
		})
	}
}

// DEFECT. stillServed compares each touched partition's owned table with the one its handle
// holds NOW, without following the map first: a handle that did nothing since a move's switch
// still holds the source's old owned table, so the check passes although the partition is
// served, and written, through the target. Another handle of the same Node, opened after the
// switch (OpenTable; Own waits until the Node's watcher has the switch: watcherAt), writes it
// there. T1 (handle H1) reads x (partition 0, on S0) and y (partition 1, on S1) and clears y,
// every row routed before the switch; partition 0 moves to S2, T2 (handle H2) clears x there
// (reading y); T1's two-phase commit validates x in S0's old owned table (nothing writes it),
// and stillServed finds H1 still holding it. Both flags end cleared: write skew. What should
// happen: the commit learns the partition is served elsewhere (follow the map, or compare the
// route's revision with the watcher's, before the check) and fails with txnode.ErrConflict;
// Update runs T1 again, which then sees x cleared.
func TestHostileTwoPhaseStillServedFollowsTheMap(t *testing.T) {
	ctx := testCtx(t)
	tc := startTxnCluster(t, 3, nil)
	a := tc.open(t, 0xa, "game-a:7000")
	h1 := createTable(t, ctx, a, "oncall", 64, 2, 1, tc.addrs[:2])
	require.NoError(t, h1.Own(ctx, 0, 1))
	var x, y uint64
	for x == 0 || y == 0 {
		id := insertRow(t, ctx, h1, onCall(1))
		switch h1.Partition(id) {
		case 0:
			x = id
		case 1:
			y = id
		}
	}
	require.NotEqual(t, h1.NodeOf(x), h1.NodeOf(y))
	mover := tc.open(t, 0xb, "")
	mt := openTable(t, ctx, mover, "oncall")

	attempts := 0
	err := a.Update(ctx, func(tx *node.Tx) error {
		attempts++
		if err := clearIfBoth(tx, h1, x, y, y, nil); err != nil {
			return err
		}
		if attempts == 1 {
			// Every row of T1 routed: x's partition moves, and T2 clears x through a
			// handle opened after the switch.
			require.NoError(t, mt.Move(ctx, 0, tc.addrs[2]))
			h2 := openTable(t, ctx, a, "oncall")
			require.NoError(t, h2.Own(ctx, 0, 1))
			require.Equal(t, tc.addrs[2], h2.NodeOf(x))
			require.NoError(t, updateRetry(ctx, a, func(tx *node.Tx) error {
				return clearIfBoth(tx, h2, x, y, x, nil)
			}))
		}
		return nil
	})
	require.NoError(t, err)
	fx, fy := flags(t, ctx, a, h1, x, y)
	require.Equal(t, uint64(0), fx, "T2 cleared x")
	require.Equal(t, uint64(1), fy, "write skew: T1's read of x was validated at the source's old owned table, which its handle still held (attempts %d)", attempts)
}

// DEFECT (the same hole as TestHostileTwoPhaseStillServedFollowsTheMap, in a View). A View
// reads x through handle H1 (partition 0, on S0); partition 0 moves to S2, and a transfer
// through handle H2 (opened after the switch) moves 10 from x to y (y on S1); the View then
// reads y through H2. stillServed finds H1 still holding S0's old owned table (H1 did nothing
// since the switch) and the View returns x before the transfer and y after it: 10 made. What
// should happen: the View's commit follows the map (H1 switched) and fails with
// txnode.ErrConflict; View runs it again and sees the total.
func TestHostileViewAcrossHandlesSeesTheTotal(t *testing.T) {
	ctx := testCtx(t)
	tc := startTxnCluster(t, 3, nil)
	a := tc.open(t, 0xa, "game-a:7000")
	h1 := createTable(t, ctx, a, "acct", 64, 2, 1, tc.addrs[:2])
	require.NoError(t, h1.Own(ctx, 0, 1))
	var x, y uint64
	for x == 0 || y == 0 {
		id := insertRow(t, ctx, h1, acctRow(initial, 0))
		switch h1.Partition(id) {
		case 0:
			x = id
		case 1:
			y = id
		}
	}
	mover := tc.open(t, 0xb, "")
	mt := openTable(t, ctx, mover, "acct")

	var h2 *node.Table
	attempts := 0
	var sum uint64
	err := a.View(ctx, func(tx *node.Tx) error {
		attempts++
		dst := make([]byte, 64)
		if err := tx.Get(h1, x, dst); err != nil {
			return err
		}
		sum = balanceOf(dst)
		if attempts == 1 {
			require.NoError(t, mt.Move(ctx, 0, tc.addrs[2]))
			h2 = openTable(t, ctx, a, "acct")
			require.NoError(t, h2.Own(ctx, 0, 1))
			require.NoError(t, updateRetry(ctx, a, func(tx *node.Tx) error {
				f, g, err := getPair(tx, h2, x, y)
				if err != nil {
					return err
				}
				if err := tx.Put(h2, x, acctRow(balanceOf(f)-10, receivedOf(f))); err != nil {
					return err
				}
				return tx.Put(h2, y, acctRow(balanceOf(g)+10, receivedOf(g)+1))
			}))
		}
		if err := tx.Get(h2, y, dst); err != nil {
			return err
		}
		sum += balanceOf(dst)
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, uint64(2*initial), sum, "the View saw x before the transfer and y after it (attempts %d)", attempts)
}

// GUARD (holds). A partition released and owned again (through another node meanwhile, which
// cleared x) while a transaction that read it runs: the transaction's later access to it is
// refused as replaced (route), and Update runs it again, on fresh rows.
func TestHostileReleasedAndOwnedAgainReadThenWrittenRunsAgain(t *testing.T) {
	ctx := testCtx(t)
	tc, a, ta, _, x, y := twoFlagsOnOneNode(t, ctx, txnode.Durable)
	b := tc.open(t, 0xc, "game-c:7000")
	tb := openTable(t, ctx, b, "oncall")
	attempts := 0
	err := a.Update(ctx, func(tx *node.Tx) error {
		attempts++
		f, g, err := getPair(tx, ta, x, y)
		if err != nil {
			return err
		}
		if attempts == 1 {
			releaseOwnElsewhereAndBack(t, ctx, ta, tb, x)
		}
		if balanceOf(f) == 1 && balanceOf(g) == 1 {
			return tx.Put(ta, x, onCall(0)) // x: the partition owned afresh
		}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, 2, attempts, "run again once its table was replaced")
	fx, fy := flags(t, ctx, a, ta, x, y)
	require.Equal(t, [2]uint64{0, 1}, [2]uint64{fx, fy}, "the other node's clear of x kept, y untouched")
}

// releaseOwnElsewhereAndBack releases x's partition from ta, has tb (another node's handle)
// own it and clear x then release it, and owns it again through ta.
func releaseOwnElsewhereAndBack(t *testing.T, ctx context.Context, ta, tb *node.Table, x uint64) {
	t.Helper()
	p := ta.Partition(x)
	require.NoError(t, ta.Release(ctx, p))
	require.NoError(t, tb.Own(ctx, p))
	require.NoError(t, tb.Put(ctx, x, onCall(0)))
	require.NoError(t, tb.Release(ctx, p))
	require.NoError(t, ta.Own(ctx, p))
}

// DEFECT (an error that should be a retry). The same release and Own afresh, the transaction
// writing only the OTHER partition (one batch, on the same storage node): its commit is
// refused (the read table's state was forgotten: no write skew), but with the forgotten
// table's error, not the txnode.ErrConflict docs/cluster.md promises for "an Own afresh"
// ("fails its commit with txnode.ErrConflict, and Update/View run it again"), nor the
// *NotOwnerError Update's doc gives a grant lost before the commit: the game sees a failure
// of a transaction over partitions it owns, and nothing tells it to retry. What should
// happen: Update runs it again (it then sees x cleared and writes nothing).
func TestHostileReleasedAndOwnedAgainOneBatchCommitRunsAgain(t *testing.T) {
	ctx := testCtx(t)
	tc, a, ta, _, x, y := twoFlagsOnOneNode(t, ctx, txnode.Durable)
	b := tc.open(t, 0xc, "game-c:7000")
	tb := openTable(t, ctx, b, "oncall")
	attempts := 0
	err := a.Update(ctx, func(tx *node.Tx) error {
		attempts++
		return clearIfBoth(tx, ta, x, y, y, func() {
			if attempts == 1 {
				releaseOwnElsewhereAndBack(t, ctx, ta, tb, x)
			}
		})
	})
	fx, fy := flags(t, ctx, a, ta, x, y)
	require.Equal(t, [2]uint64{0, 1}, [2]uint64{fx, fy}, "no write skew")
	require.NoError(t, err, "run again (attempts %d)", attempts)
}

// GUARD (holds if it passes). A one-batch commit that wrote partition 0 through the source's
// owned table, the partition moved away and BACK (the same grant: the switch keeps it) while
// the transaction ran, a write made on the target meanwhile: "its storage node took the
// batch, so the partition was not moved" would be false if the source took the old table's
// batch when the partition came back. The source's copy that came back is another table
// (another id): the batch is refused, and the write made meanwhile is kept.
func TestHostileOneBatchCommitAfterMoveAwayAndBackLosesNothing(t *testing.T) {
	t.Run("durable", func(t *testing.T) { oneBatchAwayAndBack(t, txnode.Durable) })
	t.Run("writeback", func(t *testing.T) { oneBatchAwayAndBack(t, txnode.WriteBack) })
}

func oneBatchAwayAndBack(t *testing.T, d txnode.Durability) {
	ctx := testCtx(t)
	tc := startTxnCluster(t, 2, nil)
	a := tc.openConfig(t, node.Config{Session: cluster.SessionConfig{Owner: 0xa, Addr: "game-a:7000"}, Durability: d})
	ta := createTable(t, ctx, a, "acct", 64, 1, 1, tc.addrs[:1])
	require.NoError(t, ta.Own(ctx, 0))
	x := insertRow(t, ctx, ta, acctRow(initial, 0))
	mover := tc.open(t, 0xb, "")
	mt := openTable(t, ctx, mover, "acct")
	attempts := 0
	err := a.Update(ctx, func(tx *node.Tx) error {
		attempts++
		dst := make([]byte, 64)
		if err := tx.Get(ta, x, dst); err != nil {
			return err
		}
		if err := tx.Put(ta, x, acctRow(balanceOf(dst)-1, receivedOf(dst))); err != nil {
			return err
		}
		if attempts == 1 {
			require.NoError(t, mt.Move(ctx, 0, tc.addrs[1]))
			require.NoError(t, putRetry(ctx, a, ta, x, acctRow(initial+5, 0)))
			require.NoError(t, mt.Move(ctx, 0, tc.addrs[0]))
		}
		return nil
	})
	t.Logf("outcome %v, attempts %d", err, attempts)
	var ne *node.NotOwnerError
	if err != nil {
		require.True(t, errors.As(err, &ne) || errors.Is(err, txnode.ErrConflict), "a retryable refusal: %v", err)
	}
	dst := make([]byte, 64)
	require.NoError(t, updateRetry(ctx, a, func(tx *node.Tx) error { return tx.Get(ta, x, dst) }))
	if err == nil {
		require.Equal(t, uint64(initial+5-1), balanceOf(dst), "run again over the target's write (attempts %d)", attempts)
	} else {
		require.Equal(t, uint64(initial+5), balanceOf(dst), "the target's write kept")
	}
}

// GUARD (holds). A heal (the storage node's transaction node replaced) between a
// transaction's reads and its write on that storage node: the write's route finds the
// transaction node replaced (a conflict), and Update runs it again on the new one.
func TestHostileHealMidTransactionOneBatchRunsAgain(t *testing.T) {
	ctx := testCtx(t)
	tc, a, ta, _, x, y := twoFlagsOnOneNode(t, ctx, txnode.Durable)
	attempts := 0
	err := a.Update(ctx, func(tx *node.Tx) error {
		attempts++
		return clearIfBoth(tx, ta, x, y, y, func() {
			if attempts == 1 {
				require.NoError(t, node.KillDB(ctx, a, tc.addrs[0]))
			}
		})
	})
	require.NoError(t, err, "run again on the healed transaction node (attempts %d)", attempts)
	require.Equal(t, 2, attempts)
	fx, fy := flags(t, ctx, a, ta, x, y)
	require.Equal(t, [2]uint64{1, 0}, [2]uint64{fx, fy})
}

// DEFECT (an error that should be a retry). The same heal after the transaction's last
// access (its write routed, nothing touched after): the commit goes to the dead transaction
// node and Update returns "txnode: closed" (as if the Node were closed) though the partitions
// are owned and served by the new one. docs/cluster.md counts "a heal's new
// transaction node" among the replacements that fail the commit with txnode.ErrConflict and
// run it again; what should happen: Update runs it again on the new transaction node and it
// commits (the partitions are still owned).
func TestHostileHealAfterLastAccessOneBatchRunsAgain(t *testing.T) {
	ctx := testCtx(t)
	tc, a, ta, _, x, y := twoFlagsOnOneNode(t, ctx, txnode.Durable)
	attempts := 0
	err := a.Update(ctx, func(tx *node.Tx) error {
		attempts++
		if err := clearIfBoth(tx, ta, x, y, y, nil); err != nil {
			return err
		}
		if attempts == 1 {
			require.NoError(t, node.KillDB(ctx, a, tc.addrs[0]))
		}
		return nil
	})
	require.NoError(t, err, "run again on the healed transaction node (attempts %d)", attempts)
	fx, fy := flags(t, ctx, a, ta, x, y)
	require.Equal(t, [2]uint64{1, 0}, [2]uint64{fx, fy})
}
