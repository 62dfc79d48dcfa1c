package node_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster/node"
)

// A partition moves back to a storage node that once held it: the retired copy its first
// move left there (fenced for good, serving nothing) is dropped by the second move, which
// copies afresh. Its owner writes on through the same handle across both moves, and another
// node reads the last write from the storage node it is back on. Before, the second move
// was refused (ErrMoveRefused: the target's table was not a fresh copy).
//
// The owner is a node that never owned the partition on its first storage node; one that
// did owns the fresh copy too (its kept table state is forgotten:
// TestOwnAgainAfterMoveAwayAndBack).
func TestMoveBackToFormerNode(t *testing.T) {
	ctx := testCtx(t)
	tc := startCluster(t, 2)
	a := tc.open(t, 0x1, "game-1:7000")
	mover := tc.open(t, 0x2, "game-2:7000")
	owner := tc.open(t, 0x3, "game-3:7000")
	ta := createTable(t, ctx, a, "back", 64, 2, 1, tc.addrs)
	id := ownFirstRow(t, ctx, ta)
	require.NoError(t, ta.Release(ctx, 0))
	mt := openTable(t, ctx, mover, "back")
	require.NoError(t, mt.Move(ctx, 0, tc.addrs[1]))

	tbl := openTable(t, ctx, owner, "back")
	require.NoError(t, tbl.Own(ctx, 0))
	require.Equal(t, tc.addrs[1], tbl.NodeOf(id))
	require.NoError(t, tbl.Put(ctx, id, balanceRow(11)))

	require.NoError(t, mt.Move(ctx, 0, tc.addrs[0]), "back to the storage node that held it")
	var perr error
	for try := 0; try < 10; try++ { // the *NotOwnerErrors of a move are retried
		if perr = tbl.Put(ctx, id, balanceRow(12)); perr == nil {
			break
		}
	}
	require.NoError(t, perr, "the owner writes on after the move back")
	require.Equal(t, tc.addrs[0], tbl.NodeOf(id))
	require.Equal(t, node.OwnHeld, tbl.OwnState(0))
	dst := make([]byte, 64)
	requireBalance(t, ctx, tbl, id, dst, 12)

	// Another node's durable read, from the copy the map points at again.
	require.NoError(t, tbl.Release(ctx, 0))
	requireBalance(t, ctx, mt, id, dst, 12)
	require.Equal(t, tc.addrs[0], mt.NodeOf(id))
}
