package node_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster/node"
)

// A storage node's transaction node replaced (heal.go) while an owned partition's Table
// follows a move to that storage node, between the route's store and the owned table's,
// while the owner's session hears nothing of its owner keys (its owner-key watch held
// back). The heal registers the session's grant there: the grant the switch kept, which
// the target takes (its floor is just below that grant's epoch): the partition stays owned,
// not reported lost, under the same grant, and the follow writes on. (docs/cluster.md had
// this race as a known gap, the partition reported lost; until the switch kept the owner
// key, the target refused the grant as fenced and txnode's acquireCluster took a new one.)
func TestHealRacingMoveFollow(t *testing.T) {
	gate := newWatchGate()
	// Set before any Node opens (the sessions' watch goroutines read it); restored after
	// they all closed (cleanups run last first).
	t.Cleanup(node.SetOwnerWatchHook(func(owner uint64) {
		if owner == 0x1 {
			gate.wait()
		}
	}))
	ctx := testCtx(t)
	tc := startCluster(t, 2)
	owner := tc.open(t, 0x1, "")
	mover := tc.open(t, 0x2, "")
	t.Cleanup(gate.open) // before the Nodes close: their sessions wait for the watch goroutine
	// Partition 0 on storage node 0, 1 on storage node 1 (its transaction node dialled).
	tbl := createTable(t, ctx, owner, "race", 64, 2, 1, tc.addrs)
	id := ownFirstRow(t, ctx, tbl)

	before := tc.heldBy(t, ctx, "race", 0)
	// From now on the owner's session hears nothing of its owner keys.
	gate.hold.Store(true)
	mtbl := openTable(t, ctx, mover, "race")
	require.NoError(t, mtbl.Move(ctx, 0, tc.addrs[1]))
	// The owner's next operation follows the switch from the map (not from a write the
	// retired source refuses, which would forget the owned table first).
	require.NoError(t, node.SyncMap(ctx, owner))

	fired := false
	restore := node.SetRaceHook(func(where string) {
		if where != "moved-route" || fired {
			return
		}
		fired = true
		// The route is the target's, the owned table still the source's: the heal of the
		// target's transaction node sees the partition owned there.
		require.NoError(t, node.KillDB(ctx, owner, tc.addrs[1]))
		// The heal's transaction node registered the grant the switch kept: owned, not
		// lost, the same grant.
		require.Contains(t, tbl.Owned(), uint32(0))
		tm, err := tc.c.ReadMap(ctx)
		require.NoError(t, err)
		rm, err := tm.Table("race")
		require.NoError(t, err)
		h := tc.heldBy(t, ctx, "race", 0)
		require.EqualValues(t, 0x1, h.Owner)
		require.Equal(t, before, h, "the grant the switch kept")
		require.Less(t, h.Epoch, uint64(rm.Revs[0]), "from before the switch")
		gate.open()
	})
	defer restore()
	var perr error
	for try := 0; try < 10; try++ {
		if perr = tbl.Put(ctx, id, balanceRow(2)); perr == nil {
			break
		}
	}
	require.True(t, fired)
	require.NoError(t, perr)
	require.Equal(t, tc.addrs[1], tbl.NodeOf(id))
	require.Equal(t, []uint32{0}, tbl.Owned())
	r := openTable(t, ctx, tc.open(t, 0x3, ""), "race")
	row := make([]byte, 64)
	require.NoError(t, r.Get(ctx, id, row))
	require.EqualValues(t, 2, balanceOf(row))
}
