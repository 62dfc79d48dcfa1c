package node_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/txnode/txncoord"
)

// TestUpdateWaitsForCacheTurn: two Node.Updates over one storage node, each reading 8 pages
// of its own, in the smallest cache (11 frames of 64-byte rows): both hold 4 pages, then
// read on, so the frames run out while each holds some and one of them is sent back. As
// txnode.DB.Update does, it is rolled back, parks for the cache turn and runs again holding
// it, waiting for frames once the other commits: both commit. Fails on e30d5f7: the one
// sent back returns txnode.ErrCacheFull at once.
func TestUpdateWaitsForCacheTurn(t *testing.T) {
	for _, storageNodes := range []int{1, 2} {
		t.Run(map[int]string{1: "one", 2: "two-phase"}[storageNodes], func(t *testing.T) { updateWaitsForCacheTurn(t, storageNodes) })
	}
}

// updateWaitsForCacheTurn runs the test over storageNodes (1 or 2; with 2, each update also
// writes a row on the second storage node: a two-phase commit whose part on the first one
// was sent back).
func updateWaitsForCacheTurn(t *testing.T, storageNodes int) {
	ctx := testCtx(t)
	tc := startCluster(t, storageNodes)
	a := tc.openConfig(t, node.Config{Session: cluster.SessionConfig{Owner: 0xa, Addr: "game-a:7000"}, CacheBytes: txncoord.CacheBytes(1)})
	ta := createTable(t, ctx, a, "acct", 64, storageNodes, 1, tc.addrs)
	parts := make([]uint32, storageNodes)
	for p := range parts {
		parts[p] = uint32(p)
	}
	require.NoError(t, ta.Own(ctx, parts...))
	const each = 8
	// A row on each of 2*each pages of partition 0 (storage node 0), and one row of the
	// last partition per update.
	var pages0, others []uint64
	seen := map[uint64]bool{}
	for len(pages0) < 2*each || len(others) < 2 {
		var ids []uint64
		require.NoError(t, a.Update(ctx, func(tx *node.Tx) error {
			ids = ids[:0]
			for range 64 {
				id, err := tx.Insert(ta, balanceRow(1))
				if err != nil {
					return err
				}
				ids = append(ids, id)
			}
			return nil
		}))
		for _, id := range ids {
			switch {
			case ta.Partition(id) == 0 && !seen[id/64] && len(pages0) < 2*each:
				seen[id/64] = true
				pages0 = append(pages0, id)
			case ta.Partition(id) == uint32(storageNodes-1) && storageNodes > 1 && len(others) < 2 && !seen[id/64]:
				seen[id/64] = true
				others = append(others, id)
			}
		}
		if storageNodes == 1 && len(others) < 2 {
			others = append(others, 0) // unused
		}
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
	target := func(k int) uint64 {
		if storageNodes > 1 {
			return others[k]
		}
		return pages0[k*each]
	}
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
				if err := tx.Get(ta, pages0[k*each+i], row); err != nil {
					return err
				}
			}
			return tx.Put(ta, target(k), balanceRow(uint64(10+k)))
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
		require.NoError(t, ta.Get(ctx, target(k), dst))
		require.Equal(t, uint64(10+k), balanceOf(dst))
	}
}
