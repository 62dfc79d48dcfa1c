package node_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/node"
)

// A Release whose ctx has already ended changes nothing: it returns ctx's error and the
// partition stays owned (Release's doc: "When the wait fails (ctx ends ...) the partition
// stays owned"). Before the fix (a hostile review): releaseOne's select between the owning token
// and ctx.Done picked either at random and DB.Flush's fast path ignored ctx, so the partition
// was released here and only the etcd delete failed: owned by nobody, its owner key kept for
// the lease's TTL (an hour here), and this Node could not own it again.
func TestReleaseWithEndedContextLeavesPartitionOwned(t *testing.T) {
	ctx := testCtx(t)
	tc := startCluster(t, 1)
	a := tc.openConfig(t, node.Config{Session: cluster.SessionConfig{Owner: 0xa, Addr: "game-a:7000", TTL: time.Hour}})
	const n = 8
	ta := createTable(t, ctx, a, "relctx", 64, n, 1, tc.addrs)
	all := make([]uint32, n)
	for p := range all {
		all[p] = uint32(p)
	}
	require.NoError(t, ta.Own(ctx, all...))
	ended, cancel := context.WithCancel(ctx)
	cancel()
	for _, p := range all {
		err := ta.Release(ended, p)
		require.ErrorIs(t, err, context.Canceled, "partition %d", p)
		require.Equal(t, node.OwnHeld, ta.OwnState(p), "partition %d: a Release with its ctx ended released it (%v)", p, err)
	}
}

// Once released, this Node owns the partition again through any of its handles (its
// transaction node forgot the table at the release: txncoord.Forget): a handle opened
// after the release (the map changed) owns it, and reads the rows another node wrote
// meanwhile, not its own cached ones. Before (a hostile review) the second handle's Own was
// refused as a lost grant (cluster.ErrLost); then, for good, with ErrReleased (gone: the
// transaction node kept the table's state for its life).
func TestReleasedPartitionIsNotOwnedAgainThroughAnotherHandle(t *testing.T) {
	ctx := testCtx(t)
	tc := startCluster(t, 2)
	a := tc.openConfig(t, node.Config{Session: cluster.SessionConfig{Owner: 0xa, Addr: "game-a:7000", TTL: time.Hour}})
	b := tc.openConfig(t, node.Config{Session: cluster.SessionConfig{Owner: 0xb, Addr: "game-b:7000", TTL: time.Hour}})
	ta := createTable(t, ctx, a, "reown", 64, 2, 1, tc.addrs)
	require.NoError(t, ta.Own(ctx, 0))
	var x uint64
	for {
		id := insertRow(t, ctx, ta, balanceRow(1))
		if ta.Partition(id) == 0 {
			x = id
			break
		}
	}
	require.NoError(t, ta.Put(ctx, x, balanceRow(7)))
	dst := make([]byte, 64)
	require.NoError(t, ta.Get(ctx, x, dst)) // cached at a
	require.NoError(t, ta.Release(ctx, 0))

	tb := openTable(t, ctx, b, "reown")
	require.NoError(t, tb.Own(ctx, 0))
	require.NoError(t, tb.Put(ctx, x, balanceRow(9)))
	require.NoError(t, tb.Release(ctx, 0))

	// Partition 1 (owned by nobody) moves: a's next OpenTable is a second handle.
	require.NoError(t, openTable(t, ctx, b, "reown").Move(ctx, 1, tc.addrs[0]))
	ta2 := openTable(t, ctx, a, "reown")
	require.NotSame(t, ta, ta2, "a second handle")
	require.NoError(t, ta2.Own(ctx, 0), "owned again through another handle of the Node")
	require.NoError(t, ta2.Get(ctx, x, dst))
	require.Equal(t, uint64(9), balanceOf(dst), "a stale cached row, after owning a released partition again")
}
