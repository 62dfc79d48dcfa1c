package node_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster/node"
)

// Node.Close while a two-phase commit is between its recorded decision and its Applies: the
// Update returns (the parts abandoned to the storage nodes' resolvers), it does not retry
// Applies over closed transaction nodes until its context ends.
func TestCoordCloseDuringApplyReturns(t *testing.T) {
	ctx := testCtx(t)
	tc := startTxnCluster(t, 2, nil)
	a := tc.open(t, 0xa, "game-a:7000")
	ta, err := a.CreateTable(ctx, "acct", 64, 2, 1, tc.addrs)
	require.NoError(t, err)
	require.NoError(t, ta.Own(ctx, 0, 1))
	x, err := ta.Insert(ctx, acctRow(initial, 0))
	require.NoError(t, err)
	y, err := ta.Insert(ctx, acctRow(initial, 0))
	require.NoError(t, err)
	require.NotEqual(t, ta.NodeOf(x), ta.NodeOf(y))

	closed := make(chan error, 1)
	defer node.SetCoordHook(func(step string, _ int) {
		if step == "decided" {
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			closed <- a.Close(cctx)
			cancel()
		}
	})()
	done := make(chan error, 1)
	go func() { done <- xfer(ctx, a, ta, x, y, 10) }()
	require.NoError(t, <-closed)
	select {
	case err := <-done:
		require.NoError(t, err, "commit was recorded at the primary: committed")
	case <-time.After(20 * time.Second):
		t.Fatal("Update still retrying its Applies after Node.Close")
	}
}
