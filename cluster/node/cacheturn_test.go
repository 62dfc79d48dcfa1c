package node_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/txnode"
)

// TestUpdateWaitsForCacheTurn: two Node.Updates over one storage node, each reading 8 pages
// of its own, in the smallest cache (11 frames of 64-byte rows): both hold 4 pages, then
// read on, so the frames run out while each holds some and one of them is sent back. As
// txnode.DB.Update does, it is rolled back, parks for the cache turn and runs again holding
// it, waiting for frames once the other commits: both commit. Fails on e30d5f7: the one
// sent back returns txnode.ErrCacheFull at once.
func TestUpdateWaitsForCacheTurn(t *testing.T) {
	ctx := testCtx(t)
	tc := startCluster(t, 1)
	a := tc.openConfig(t, node.Config{Session: cluster.SessionConfig{Owner: 0xa, Addr: "game-a:7000"}, CacheBytes: txnode.MinCacheBytes})
	ta, err := a.CreateTable(ctx, "acct", 64, 1, 1, tc.addrs)
	require.NoError(t, err)
	require.NoError(t, ta.Own(ctx, 0))
	const pages, each = 16, 8
	for range pages {
		require.NoError(t, a.Update(ctx, func(tx *node.Tx) error {
			for range 64 {
				if _, err := tx.Insert(ta, balanceRow(1)); err != nil {
					return err
				}
			}
			return nil
		}))
	}
	retries := func() uint64 {
		var n uint64
		for _, s := range a.StoreStats() {
			n += s.Retries
		}
		return n
	}
	before := retries()

	halfway := [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	var runs [2]atomic.Int32
	update := func(k int) error {
		return a.Update(ctx, func(tx *node.Tx) error {
			first := runs[k].Add(1) == 1
			row := make([]byte, 64)
			for i := range each {
				if i == each/2 && first {
					close(halfway[k]) // both hold half their pages before either reads on
					select {
					case <-halfway[1-k]:
					case <-ctx.Done():
						return context.Cause(ctx)
					}
				}
				if err := tx.Get(ta, uint64((k*each+i)*64), row); err != nil {
					return err
				}
			}
			return tx.Put(ta, uint64(k*each*64), balanceRow(uint64(10+k)))
		})
	}
	errs := make(chan error, 2)
	for k := range 2 {
		go func() { errs <- update(k) }()
	}
	for range 2 {
		require.NoError(t, <-errs, "an update sent back for the cache turn runs again")
	}
	require.Greater(t, retries(), before, "one was sent back and parked for the turn")
	require.Greater(t, runs[0].Load()+runs[1].Load(), int32(2), "and ran again")
	dst := make([]byte, 64)
	for k := range 2 {
		require.NoError(t, ta.Get(ctx, uint64(k*each*64), dst))
		require.Equal(t, uint64(10+k), balanceOf(dst))
	}
}
