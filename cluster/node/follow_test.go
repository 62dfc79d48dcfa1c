package node_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster"
)

// A partition moved under its owner's writes: the owner keeps writing through the same
// handle (no OpenTable, no Own), retrying the *NotOwnerErrors of the move within a bound,
// and owns the partition on the new storage node by itself, under the same grant (the switch
// keeps the owner key); every acknowledged write
// is on the new copy; a non-owner's durable reads, through a handle opened before the move,
// follow it; a dropped table's handle fails with cluster.ErrTableNotFound.
func TestMoveOwnerFollowsMap(t *testing.T) {
	ctx := testCtx(t)
	rows, writes := 100, 400
	if testing.Short() {
		rows, writes = 30, 120
	}
	tc, w := startMoveWriter(t, ctx, rows)
	before := w.grant(t, ctx)

	_, rtbl := tc.openNodeTable(t, ctx, 0x3, "acct")
	row := make([]byte, 64)
	require.NoError(t, rtbl.Get(ctx, w.ids[0], row))

	_, mtbl := tc.openNodeTable(t, ctx, 0x2, "acct")
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
		id := insertRow(t, ctx, w.tbl, balanceRow(v))
		w.fresh[id] = v
	}
	require.Equal(t, tc.addrs[1], w.tbl.NodeOf(w.ids[0]))
	require.Contains(t, w.tbl.Owned(), uint32(0))
	require.Equal(t, before, w.grant(t, ctx), "the same grant on the new copy: the switch keeps it")
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
		err := rtbl.Get(ctx, w.ids[0], row)
		if errors.Is(err, cluster.ErrTableNotFound) {
			break
		}
		require.Less(t, try, 1000, "a dropped table's handle still reads: %v", err)
	}
}

// A partition moved away while its owner writes it and another of its partitions on the
// same source storage node: the write refused by the frozen source fail-stops the owner's
// transaction node of the source (txnode's pipeline), and the node replaces it (heal.go), so
// the other partition on the source goes on taking writes through the same handle, as the
// moved one does on the target.
func TestMoveSourceOtherPartitionsHeal(t *testing.T) {
	ctx := testCtx(t)
	// Partitions 0 and 2 on storage node 0, 1 on storage node 1.
	tc, _, tbl := startWithTable(t, ctx, 2, 0x1, "game-1:7000", "acct", 3)
	require.NoError(t, tbl.Own(ctx, 0, 2))
	ids := map[uint32]uint64{}
	for len(ids) < 2 {
		id := insertRow(t, ctx, tbl, balanceRow(1))
		ids[tbl.Partition(id)] = id
	}
	require.Equal(t, tc.addrs[0], tbl.NodeOf(ids[2]))

	_, mtbl := tc.openNodeTable(t, ctx, 0x2, "acct")
	moved := make(chan error, 1)
	go func() { moved <- mtbl.Move(ctx, 0, tc.addrs[1]) }()
	// Write partition 0 until the freeze refuses a write (or the move ends first).
	refusedAt := 0
	for v := uint64(2); ; v++ {
		if err := tbl.Put(ctx, ids[0], balanceRow(v)); err != nil {
			refusedAt = int(v)
			break
		}
		select {
		case err := <-moved:
			require.NoError(t, err)
			moved <- nil
		default:
			continue
		}
		break
	}
	require.NoError(t, <-moved)
	t.Logf("partition 0 refused at write %d (0: the move ended first)", refusedAt)
	// Both partitions take writes through the same handle, within a bound of retries.
	last := map[uint32]uint64{}
	for i := range 20 {
		for _, p := range []uint32{2, 0} { // 2 first: the healed source
			v := uint64(1000 + i)
			var err error
			for try := 0; try < 10; try++ {
				if err = tbl.Put(ctx, ids[p], balanceRow(v)); err == nil {
					break
				}
			}
			require.NoError(t, err, "partition %d", p)
			last[p] = v
		}
	}
	require.Equal(t, tc.addrs[1], tbl.NodeOf(ids[0]))
	require.Equal(t, tc.addrs[0], tbl.NodeOf(ids[2]))
	require.ElementsMatch(t, []uint32{0, 2}, tbl.Owned())
	r := openTable(t, ctx, tc.open(t, 0x3, ""), "acct")
	row := make([]byte, 64)
	for p, id := range ids {
		require.NoError(t, r.Get(ctx, id, row))
		require.Equal(t, last[p], balanceOf(row), "partition %d", p)
	}
}

// A storage node's transaction node replaced (heal.go) while an Own of one of its partitions
// is between its grant and its store: the heal did not see the partition owned yet, so Own
// must not keep the dead transaction node's table. On 6387942 it did: the partition stayed
// owned on the closed transaction node, and every write of it failed for good.
func TestOwnRacingHeal(t *testing.T) {
	ctx := testCtx(t)
	tc, n, tbl := startWithTable(t, ctx, 1, 0x1, "", "race", 2)
	require.NoError(t, tbl.Own(ctx, 1))
	restore, fired := killDBAt(t, ctx, n, tc.addrs[0], "own")
	require.NoError(t, tbl.Own(ctx, 0))
	restore()
	require.True(t, fired())
	require.ElementsMatch(t, []uint32{1, 0}, tbl.Owned())
	for p := uint32(0); p < 2; p++ {
		id := insertRow(t, ctx, tbl, balanceRow(uint64(p)))
		require.NoError(t, tbl.Put(ctx, id, balanceRow(5)), "partition %d", tbl.Partition(id))
	}
}

// A storage node's transaction node replaced (heal.go) while an owned partition's Table
// follows it there after a move, between the dial and the route's store: the heal did not
// see the route yet, so the follow must not keep the dead transaction node's handles. On
// 6387942 it did: the partition was reported not owned and its reads failed for good.
func TestMoveFollowRacingHeal(t *testing.T) {
	ctx := testCtx(t)
	// Partition 0 on storage node 0, 1 on storage node 1 (its transaction node dialled).
	tc, owner, tbl := startWithTable(t, ctx, 2, 0x1, "", "race", 2)
	require.NoError(t, tbl.Own(ctx, 0))
	id := insertRow(t, ctx, tbl, balanceRow(1))
	_, mtbl := tc.openNodeTable(t, ctx, 0x2, "race")
	require.NoError(t, mtbl.Move(ctx, 0, tc.addrs[1]))
	restore, fired := killDBAt(t, ctx, owner, tc.addrs[1], "moved")
	defer restore()
	var perr error
	for try := 0; try < 10; try++ {
		if perr = tbl.Put(ctx, id, balanceRow(2)); perr == nil {
			break
		}
	}
	require.True(t, fired())
	require.NoError(t, perr)
	require.Equal(t, tc.addrs[1], tbl.NodeOf(id))
	row := make([]byte, 64)
	require.NoError(t, tbl.Get(ctx, id, row))
	require.EqualValues(t, 2, balanceOf(row))
	require.Equal(t, []uint32{0}, tbl.Owned())
}

// A storage node's transaction node replaced (heal.go) while OpenTable opens a table on it,
// between the durable-read handles' opens and the table's registration: the heal did not
// see the table yet, so OpenTable must not keep the dead transaction node's handles. On
// 6387942 it did: the handle's reads of that storage node failed for good.
func TestOpenTableRacingHeal(t *testing.T) {
	ctx := testCtx(t)
	tc, creator, ct := startWithTable(t, ctx, 1, 0x1, "", "race", 1)
	require.NoError(t, ct.Own(ctx, 0))
	id := insertRow(t, ctx, ct, balanceRow(3))
	require.NoError(t, creator.Close(ctx))

	n := tc.open(t, 0x2, "")
	restore, fired := killDBAt(t, ctx, n, tc.addrs[0], "open")
	defer restore()
	tbl := openTable(t, ctx, n, "race")
	require.True(t, fired())
	row := make([]byte, 64)
	require.NoError(t, tbl.Get(ctx, id, row))
	require.EqualValues(t, 3, balanceOf(row))
}
