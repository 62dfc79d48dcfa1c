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
// stays owned"). Defect: releaseOne's select between the owning token and ctx.Done picks
// either at random (own.go releaseOne), Flush's fast path returns nil for a DB with nothing
// pending without looking at ctx (versions.go waitVer), so the partition is released here
// and only the etcd delete fails: owned by nobody, its owner key kept for the lease's TTL
// (an hour here), and this Node cannot own it again (ErrReleased).
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
