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
// Known defect (fails on 9fe08b2 and on 258841e): movedOn registers the new grant while the
// target is still incoming, the target refuses it (storenode.ErrMoved), and movedOn forgets
// the partition as not owned; nothing follows again after the activation (the map does not
// change), so every later write is a *NotOwnerError "nor by any other (Own it)" until the
// game Owns it again. A heal of the target's transaction node in that window (reown) ends
// the same way (t.moving, then the same refusal).
func TestMoveFollowBeforeActivation(t *testing.T) {
	t.Skip("known defect: a move's follow between the switch and the target's activation forgets the partition as not owned (the target refuses the grant with ErrMoved while incoming); see the comment")
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
	// The owner follows the switch now, the target not active yet: its write is refused
	// (retryable) or goes through.
	require.NoError(t, node.SyncMap(ctx, owner))
	perr := tbl.Put(ctx, id, balanceRow(2))
	t.Logf("the write while the target is incoming: %v", perr)
	unblock()
	require.NoError(t, <-errc)

	// The move complete, nobody else owning the partition: the owner writes on.
	for try := 0; try < 10; try++ {
		if perr = tbl.Put(ctx, id, balanceRow(3)); perr == nil {
			break
		}
	}
	require.NoError(t, perr, "the owner writes on through the same handle once the target is live")
	require.Equal(t, []uint32{0}, tbl.Owned())
}
