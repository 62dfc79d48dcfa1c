package node_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/txnode"
)

// A transaction that read a partition before it moved and writes it after is run again: its
// read was served by the source's owned table, which nothing writes once the partition is
// served from the target, so its validation there would pass over a write made meanwhile
// (before, the second write below was lost: the transaction's write went to the target
// blind, its read validated at the source's cache; the bank under a move lost or made a
// unit about once in a hundred runs).
func TestTxReadBeforeMoveWrittenAfterRunsAgain(t *testing.T) {
	ctx := testCtx(t)
	tc, a, ta, mt, ids := startMoveRig(t, ctx, 3, 0, 1)
	x, y := ids[0], ids[1] // an account in partition 0 (the one moved) and one in partition 1

	attempts := 0
	err := a.Update(ctx, func(tx *node.Tx) error {
		attempts++
		f, g, err := getPair(tx, ta, x, y)
		if err != nil {
			return err
		}
		if attempts == 1 {
			// Between the reads and the writes: x moves, and another transaction writes
			// it on the target.
			require.NoError(t, mt.Move(ctx, 0, tc.addrs[2]))
			require.NoError(t, putRetry(ctx, a, ta, x, acctRow(balanceOf(f)+5, receivedOf(f))))
		}
		if err := tx.Put(ta, x, acctRow(balanceOf(f)-1, receivedOf(f))); err != nil {
			return err
		}
		return tx.Put(ta, y, acctRow(balanceOf(g)+1, receivedOf(g)+1))
	})
	require.NoError(t, err)
	require.Equal(t, tc.addrs[2], ta.NodeOf(x))
	dst := make([]byte, 64)
	require.NoError(t, a.View(ctx, func(tx *node.Tx) error { return tx.Get(ta, x, dst) }))
	require.Equal(t, uint64(initial+5-1), balanceOf(dst), "the write made on the target is kept")
	require.Equal(t, 2, attempts, "the transaction ran again once the partition it read moved")
}

// A View that read a partition before it moved and another after is run again too: the
// first read was validated where nothing writes any more (a transfer on the target in
// between would have been seen half).
func TestViewAcrossMoveRunsAgain(t *testing.T) {
	ctx := testCtx(t)
	tc, a, ta, mt, ids := startMoveRig(t, ctx, 3, 0, 1)
	x, y := ids[0], ids[1]

	attempts := 0
	var sum uint64
	err := a.View(ctx, func(tx *node.Tx) error {
		attempts++
		dst := make([]byte, 64)
		if err := tx.Get(ta, x, dst); err != nil {
			return err
		}
		sum = balanceOf(dst)
		if attempts == 1 {
			require.NoError(t, mt.Move(ctx, 0, tc.addrs[2]))
			require.NoError(t, xferRetry(ctx, a, ta, x, y)) // x on the target, y
		}
		if err := tx.Get(ta, y, dst); err != nil {
			return err
		}
		sum += balanceOf(dst)
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, uint64(2*initial), sum, "the view saw the transfer whole")
	require.Equal(t, 2, attempts, "the view ran again once the partition it read moved")
}

// putRetry puts row at id in a transaction of its own, run again while it fails as
// not-owner (a partition being switched: documented as retryable), a bounded number of times.
func putRetry(ctx context.Context, n *node.Node, t *node.Table, id uint64, row []byte) error {
	var err error
	for range 50 {
		var ne *node.NotOwnerError
		err = n.Update(ctx, func(tx *node.Tx) error { return tx.Put(t, id, row) })
		if err == nil || !errors.As(err, &ne) && !errors.Is(err, txnode.ErrConflict) {
			return err
		}
	}
	return err
}

// A one-batch transaction that read a partition before it moved and writes another
// partition of the same storage node is run again too: its storage node takes the batch (the
// partition written is not moving), and the read was validated in the source's cache; the
// source's table is superseded before the target's is published (txncoord.Supersede), so
// the validation fails (before, the row written was computed from the stale read).
func TestOneBatchTxReadBeforeMoveRunsAgain(t *testing.T) {
	ctx := testCtx(t)
	tc, a, ta, mt, ids := startMoveRig(t, ctx, 4, 0, 3)
	x, z := ids[0], ids[1] // in partitions 0 (moved) and 3, both on the first storage node
	require.Equal(t, ta.NodeOf(x), ta.NodeOf(z), "partitions 0 and 3 share a storage node")

	attempts := 0
	err := a.Update(ctx, func(tx *node.Tx) error {
		attempts++
		row := make([]byte, 64)
		if err := tx.Get(ta, x, row); err != nil {
			return err
		}
		if attempts == 1 {
			require.NoError(t, mt.Move(ctx, 0, tc.addrs[2]))
			require.NoError(t, putRetry(ctx, a, ta, x, acctRow(balanceOf(row)+5, 0)))
		}
		return tx.Put(ta, z, acctRow(balanceOf(row), 0)) // z copies x as read
	})
	require.NoError(t, err)
	dst := make([]byte, 64)
	require.NoError(t, a.View(ctx, func(tx *node.Tx) error { return tx.Get(ta, z, dst) }))
	require.Equal(t, uint64(initial+5), balanceOf(dst), "z copies x as it is after the move, not as it was read before")
	require.Equal(t, 2, attempts, "the transaction ran again once the partition it read moved")
}

// startMoveRig starts 3 storage nodes and node a (owner 0xa), creates its table "acct" of
// partitions partitions over them, owns parts, and inserts until each owned partition holds
// an account (initial balance): their ids, in parts' order. It returns a mover's handle of
// the table too (owner 0xb). a closes when the test ends.
func startMoveRig(t *testing.T, ctx context.Context, partitions int, parts ...uint32) (*testCluster, *node.Node, *node.Table, *node.Table, []uint64) {
	t.Helper()
	tc := startTxnCluster(t, 3, nil)
	a := tc.open(t, 0xa, "game-a:7000")
	ta := createTable(t, ctx, a, "acct", 64, partitions, 1, tc.addrs)
	require.NoError(t, ta.Own(ctx, parts...))
	ids := make([]uint64, len(parts))
	for left := len(parts); left > 0; {
		id, err := ta.Insert(ctx, acctRow(initial, 0))
		require.NoError(t, err)
		if i := slices.Index(parts, ta.Partition(id)); i >= 0 && ids[i] == 0 {
			ids[i] = id
			left--
		}
	}
	mover := tc.open(t, 0xb, "")
	return tc, a, ta, openTable(t, ctx, mover, "acct"), ids
}
