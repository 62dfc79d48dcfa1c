package node_test

import (
	"errors"
	"testing"

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
	tc := startCluster(t, 2)
	owner := tc.openWriteBack(t, 0xa2)
	tbl, err := owner.CreateTable(ctx, "wb", 64, 2, 1, tc.addrs)
	require.NoError(t, err)
	require.NoError(t, tbl.Own(ctx, 0))
	id, err := tbl.Insert(ctx, balanceRow(1))
	require.NoError(t, err)
	require.EqualValues(t, 0, tbl.Partition(id))
	require.NoError(t, tbl.Put(ctx, id, balanceRow(7)), "acknowledged, in the owner's cache only")

	mover := tc.open(t, 0xd, "")
	mt, err := mover.OpenTable(ctx, "wb")
	require.NoError(t, err)
	require.NoError(t, mt.Move(ctx, 0, tc.addrs[1]))

	got := make([]byte, 64)
	require.NoError(t, mt.Get(ctx, id, got), "another node reads the moved copy's durable row")
	require.Equal(t, balanceRow(7), got, "the acknowledged write was copied")
	require.NoError(t, tbl.Get(ctx, id, got))
	require.Equal(t, balanceRow(7), got, "the owner reads its write")
	// The owner writes on, on the target, once the move ended.
	require.NoError(t, putRetry(t, tbl, id, balanceRow(8)))
	require.NoError(t, owner.Close(ctx))
	require.NoError(t, mt.Get(ctx, id, got))
	require.Equal(t, balanceRow(8), got, "flushed to the target at Close")
}

// From the owner's flush until the move ends, its writes of the partition are refused as
// not-owner (never acknowledged: the frozen source would refuse them), other partitions'
// go on; once the move ended it writes the partition on the target.
func TestMoveHoldsWriteBackWritesUntilItEnds(t *testing.T) {
	ctx := testCtx(t)
	tc := startCluster(t, 2)
	owner := tc.openWriteBack(t, 0xa3)
	tbl, err := owner.CreateTable(ctx, "wb", 64, 2, 1, tc.addrs)
	require.NoError(t, err)
	require.NoError(t, tbl.Own(ctx, 0, 1))
	var ids [2]uint64
	for ids[0] == 0 || ids[1] == 0 {
		id, err := tbl.Insert(ctx, balanceRow(1))
		require.NoError(t, err)
		ids[tbl.Partition(id)] = id
	}

	flushed, release := make(chan struct{}), make(chan struct{})
	node.SetMoveStepHook(func(step string) {
		if step == node.MoveStepFlushed {
			close(flushed)
			<-release
		}
	})
	defer node.SetMoveStepHook(nil)
	mover := tc.open(t, 0xd, "")
	mt, err := mover.OpenTable(ctx, "wb")
	require.NoError(t, err)
	errc := make(chan error, 1)
	go func() { errc <- mt.Move(ctx, 0, tc.addrs[1]) }()
	select {
	case <-flushed:
	case err := <-errc:
		close(release)
		t.Fatalf("the move ended before the owner flushed: %v", err)
	}
	err = tbl.Put(ctx, ids[0], balanceRow(2))
	var ne *node.NotOwnerError
	require.True(t, errors.As(err, &ne), "a held write is not-owner, got %v", err)
	require.True(t, ne.Held)
	require.ErrorIs(t, err, txnode.ErrMoved)
	require.NoError(t, tbl.Put(ctx, ids[1], balanceRow(3)), "the other partition is written on")
	close(release)
	require.NoError(t, <-errc)
	require.NoError(t, putRetry(t, tbl, ids[0], balanceRow(4)))
	got := make([]byte, 64)
	require.NoError(t, tbl.Get(ctx, ids[0], got))
	require.Equal(t, balanceRow(4), got)
	require.NoError(t, owner.Close(ctx))
	require.NoError(t, mt.Get(ctx, ids[0], got))
	require.Equal(t, balanceRow(4), got)
	require.NoError(t, mt.Get(ctx, ids[1], got))
	require.Equal(t, balanceRow(3), got)
}

// putRetry is Put, run again while it fails as not-owner (the follow of a move that just
// ended), a bounded number of times.
func putRetry(t *testing.T, tbl *node.Table, id uint64, row []byte) error {
	t.Helper()
	var err error
	for range 50 {
		var ne *node.NotOwnerError
		if err = tbl.Put(testCtx(t), id, row); err == nil || !errors.As(err, &ne) {
			return err
		}
	}
	return err
}
