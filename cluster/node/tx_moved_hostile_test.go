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
