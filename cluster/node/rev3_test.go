package node_test

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/node"
)

// A move's switch keeps the owner's grant, so a second handle of the owner's node, opened
// after the switch (OpenTable reads the map itself: it routes the partition to the target),
// owns the partition there under the very grant the first handle holds and writes. The
// first handle, whose node's map watcher has not delivered the switch yet (held back here
// by the test hook; in production a watch delivery late), must not serve the partition's
// rows from its cache at the frozen source after that write was acknowledged: that is a
// stale read of an acknowledged write. Own waits for the node's watcher to reach the
// revision its routes reflect before it registers the grant (every later operation of the
// node's other handles follows the switch first). When the switch deleted the owner key
// the second handle's grant was a new one, taken only once the session heard the delete,
// which ended the first handle's grant: no stale read.
// Fails on 7f9ad60: the first handle read 1 after the second acknowledged 2.
func TestMoveSecondHandleOwnNoStaleRead(t *testing.T) {
	var hold atomic.Bool
	release := make(chan struct{})
	var once sync.Once
	unhold := func() { once.Do(func() { close(release) }) }
	var ownerClient atomic.Pointer[cluster.Client]
	t.Cleanup(node.SetMapWatchHook(func(c any) {
		if c == any(ownerClient.Load()) && hold.Load() {
			<-release
		}
	}))
	waiting := make(chan struct{}, 1)
	t.Cleanup(node.SetRaceHook(func(where string) {
		if where == "own-watch" {
			select {
			case waiting <- struct{}{}:
			default:
			}
		}
	}))
	ctx := testCtx(t)
	tc := startCluster(t, 2)
	owner := tc.open(t, 0x1, "")
	ownerClient.Store(owner.Client())
	mover := tc.open(t, 0x2, "")
	t.Cleanup(unhold) // before the Nodes close
	tbl, err := owner.CreateTable(ctx, "twoh", 64, 2, 1, tc.addrs)
	require.NoError(t, err)
	require.NoError(t, tbl.Own(ctx, 0))
	id, err := tbl.Insert(ctx, balanceRow(1))
	require.NoError(t, err)
	require.EqualValues(t, 0, tbl.Partition(id))

	hold.Store(true)
	mtbl, err := mover.OpenTable(ctx, "twoh")
	require.NoError(t, err)
	require.NoError(t, mtbl.Move(ctx, 0, tc.addrs[1]))

	tbl2, err := owner.OpenTable(ctx, "twoh")
	require.NoError(t, err)
	require.Equal(t, tc.addrs[1], tbl2.NodeOf(id), "the fresh handle routes to the target")
	wrote := make(chan error, 1)
	go func() {
		if err := tbl2.Own(ctx, 0); err != nil {
			wrote <- err
			return
		}
		wrote <- tbl2.Put(ctx, id, balanceRow(2))
	}()
	select {
	case err := <-wrote:
		require.NoError(t, err, "the second handle owns and writes at the target")
	case <-waiting:
		// Own waits for the watcher: nothing written yet, the first handle's read is
		// current.
		row := make([]byte, 64)
		require.NoError(t, tbl.Get(ctx, id, row))
		require.EqualValues(t, 1, balanceOf(row))
		unhold()
		require.NoError(t, <-wrote, "the second handle owns and writes at the target")
	}
	row := make([]byte, 64)
	require.NoError(t, tbl.Get(ctx, id, row), "the first handle's read")
	require.EqualValues(t, 2, balanceOf(row), "the first handle's read after the second handle's acknowledged write")
	unhold()
}
