package node_test

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster/node"
)

// A storage node's transaction node replaced (heal.go) while an owned partition's Table
// follows a move to that storage node, between the route's store and the new grant, while
// the owner's session has not heard the switch's delete of the owner key yet (its
// owner-key watch held back): the heal must not register the session's grant from before
// the switch there (the target's floor is the switch's revision: it refuses it as fenced)
// and so report the partition lost. On 258841e (with this test's hook points) it did: the
// partition was dropped as lost, and every write of it failed with a *NotOwnerError.
func TestHealRacingMoveFollow(t *testing.T) {
	var hold atomic.Bool
	release := make(chan struct{})
	var once sync.Once
	unhold := func() { once.Do(func() { close(release) }) }
	// Set before any Node opens (the sessions' watch goroutines read it); restored after
	// they all closed (cleanups run last first).
	t.Cleanup(node.SetOwnerWatchHook(func(owner uint64) {
		if owner == 0x1 && hold.Load() {
			<-release
		}
	}))
	ctx := testCtx(t)
	tc := startCluster(t, 2)
	owner := tc.open(t, 0x1, "")
	mover := tc.open(t, 0x2, "")
	t.Cleanup(unhold) // before the Nodes close: their sessions wait for the watch goroutine
	// Partition 0 on storage node 0, 1 on storage node 1 (its transaction node dialled).
	tbl, err := owner.CreateTable(ctx, "race", 64, 2, 1, tc.addrs)
	require.NoError(t, err)
	require.NoError(t, tbl.Own(ctx, 0))
	id, err := tbl.Insert(ctx, balanceRow(1))
	require.NoError(t, err)
	require.EqualValues(t, 0, tbl.Partition(id))

	// From now on the owner's session hears nothing of its owner keys: the switch's delete
	// of partition 0's owner key stays unheard, so the session still holds that grant.
	hold.Store(true)
	mtbl, err := mover.OpenTable(ctx, "race")
	require.NoError(t, err)
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
		unhold() // the session hears the delete; the follow acquires anew
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
	r, err := tc.open(t, 0x3, "").OpenTable(ctx, "race")
	require.NoError(t, err)
	row := make([]byte, 64)
	require.NoError(t, r.Get(ctx, id, row))
	require.EqualValues(t, 2, balanceOf(row))
}
