package node_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster/node"
)

// The owner's Table follows a move's switch before the mover activated the target (the
// copy takes no grant yet: storenode.ErrMoved). The owner must still own the partition on
// the target once the move is complete, writing on through the same handle (docs/cluster.md:
// "so the owner writes on through the same handle"; "reported not owned" only when another
// node took it).
//
// On 9fe08b2 (and 258841e) movedOn registered the new grant once: the target, still
// incoming, refused it (storenode.ErrMoved), movedOn forgot the partition as not owned, and
// nothing followed again after the activation (the map does not change): every later write
// was a *NotOwnerError "nor by any other (Own it)". Now the follow asks again, a bounded
// number of times; the test releases the mover at the first refusal ("moved-incoming").
func TestMoveFollowBeforeActivation(t *testing.T) {
	ctx := testCtx(t)
	tc := startCluster(t, 2)
	owner := tc.open(t, 0x1, "")
	mover := tc.open(t, 0x2, "")
	tbl, err := owner.CreateTable(ctx, "act", 64, 2, 1, tc.addrs)
	require.NoError(t, err)
	require.NoError(t, tbl.Own(ctx, 0))
	id, err := tbl.Insert(ctx, balanceRow(1))
	require.NoError(t, err)
	require.EqualValues(t, 0, tbl.Partition(id))
	mtbl, err := mover.OpenTable(ctx, "act")
	require.NoError(t, err)

	switched := make(chan struct{})
	release := make(chan struct{})
	node.SetMoveStepHook(func(step string) {
		if step == node.MoveStepSwitched {
			close(switched)
			<-release
		}
	})
	defer node.SetMoveStepHook(nil)
	released := false
	unblock := func() {
		if !released {
			released = true
			close(release)
		}
	}
	defer unblock()
	errc := make(chan error, 1)
	go func() { errc <- mtbl.Move(ctx, 0, tc.addrs[1]) }()
	select {
	case <-switched:
	case err := <-errc:
		t.Fatalf("the move ended before its switch: %v", err)
	}
	// The owner follows the switch now, the target not active yet: the target refuses its
	// new grant; the mover is released then, and the follow's next registration is taken.
	refused := false
	defer node.SetRaceHook(func(where string) {
		if where == "moved-incoming" && !refused {
			refused = true
			unblock()
		}
	})()
	require.NoError(t, node.SyncMap(ctx, owner))
	perr := tbl.Put(ctx, id, balanceRow(2))
	t.Logf("the write while the target is incoming: %v", perr)
	unblock()
	require.NoError(t, <-errc)
	require.True(t, refused, "the target refused the follow's grant while incoming")

	// The move complete, nobody else owning the partition: the owner writes on.
	for try := 0; try < 10; try++ {
		if perr = tbl.Put(ctx, id, balanceRow(3)); perr == nil {
			break
		}
	}
	require.NoError(t, perr, "the owner writes on through the same handle once the target is live")
	require.Equal(t, []uint32{0}, tbl.Owned())
}
