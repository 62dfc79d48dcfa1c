package node_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster"
)

// A partition moved under its owner's writes: the owner keeps writing through the same
// handle (no OpenTable, no Own), retrying the *NotOwnerErrors of the move within a bound,
// and owns the partition again on the new storage node by itself; every acknowledged write
// is on the new copy; a non-owner's durable reads, through a handle opened before the move,
// follow it; a dropped table's handle fails with cluster.ErrTableNotFound.
func TestMoveOwnerFollowsMap(t *testing.T) {
	ctx := testCtx(t)
	rows, writes := 100, 400
	if testing.Short() {
		rows, writes = 30, 120
	}
	tc := startCluster(t, 2)
	owner := tc.open(t, 0x1, "game-1:7000")
	tbl, err := owner.CreateTable(ctx, "acct", 64, 2, 1, tc.addrs)
	require.NoError(t, err)
	w := newMoveWriter(t, ctx, owner, tbl, rows)

	reader := tc.open(t, 0x3, "")
	rtbl, err := reader.OpenTable(ctx, "acct")
	require.NoError(t, err)
	row := make([]byte, 64)
	require.NoError(t, rtbl.Get(ctx, w.ids[0], row))

	mover := tc.open(t, 0x2, "")
	mtbl, err := mover.OpenTable(ctx, "acct")
	require.NoError(t, err)
	started, moved := make(chan struct{}), make(chan error, 1)
	go func() {
		<-started
		moved <- mtbl.Move(ctx, 0, tc.addrs[1])
	}()
	done, refused := false, 0
	for v := uint64(2); v < uint64(writes); v++ {
		if v == uint64(writes/4) {
			close(started)
		}
		for try := 0; ; try++ {
			if !w.put(t, ctx, int(v), v) {
				break
			}
			refused++
			if !done {
				require.NoError(t, <-moved) // wait for the move (a channel), then retry
				done = true
			}
			require.Less(t, try, 20, "the owner did not take the partition back after the move")
		}
	}
	if !done {
		require.NoError(t, <-moved)
	}
	// The same handle, the same owner: writes and inserts on the new copy.
	for i := range 20 {
		v := uint64(writes + 1 + i)
		for try := 0; w.put(t, ctx, i, v); try++ {
			require.Less(t, try, 20, "the owner did not take the partition back after the move")
		}
		id, err := w.tbl.Insert(ctx, balanceRow(v))
		require.NoError(t, err)
		w.fresh[id] = v
	}
	require.Equal(t, tc.addrs[1], w.tbl.NodeOf(w.ids[0]))
	require.Contains(t, w.tbl.Owned(), uint32(0))
	t.Logf("%d writes refused during the move", refused)

	// The reader's old handle reads the new copy (the old one is retired: it refuses reads).
	for id, v := range w.acked {
		require.NoError(t, rtbl.Get(ctx, id, row))
		require.Equal(t, v, balanceOf(row), "row %d through the reader's old handle", id)
	}
	require.Equal(t, tc.addrs[1], rtbl.NodeOf(w.ids[0]))
	w.check(t, ctx, tc.open(t, 0x4, ""))

	// Dropped: the handles fail clearly.
	w.n.Close(ctx) // its error may be the source transaction node's refused batch (fail-stop pipeline)
	require.NoError(t, tc.c.DropTable(ctx, "acct"))
	for try := 0; ; try++ {
		err = rtbl.Get(ctx, w.ids[0], row)
		if errors.Is(err, cluster.ErrTableNotFound) {
			break
		}
		require.Less(t, try, 1000, "a dropped table's handle still reads: %v", err)
	}
}
