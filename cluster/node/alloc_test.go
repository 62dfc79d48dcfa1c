//go:build !race

package node_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/txnode"
)

// The hot path of an owned partition through a node.Table (the map follow, the heal check,
// the owned table's load) adds no allocation to txnode's: a cache-hit Get, and a Put in
// WriteBack mode (acknowledged from the cache), allocate nothing.
func TestOwnedTableHotPathAllocs(t *testing.T) {
	ctx := testCtx(t)
	tc := startCluster(t, 1)
	n := tc.openConfig(t, node.Config{Session: cluster.SessionConfig{Owner: 0xa11c}, Durability: txnode.WriteBack})
	tbl := createTable(t, ctx, n, "alloc", 64, 1, 1, tc.addrs)
	require.NoError(t, tbl.Own(ctx, 0))
	var ids []uint64
	for range 8 {
		id := insertRow(t, ctx, tbl, balanceRow(1))
		ids = append(ids, id)
	}
	buf := make([]byte, 64)
	row := balanceRow(7)
	for range 3 {
		for _, id := range ids {
			require.NoError(t, tbl.Get(ctx, id, buf))
			require.NoError(t, tbl.Put(ctx, id, row))
		}
	}
	i := 0
	next := func() uint64 { i++; return ids[i%len(ids)] }
	get := testing.AllocsPerRun(500, func() {
		if err := tbl.Get(ctx, next(), buf); err != nil {
			panic(err)
		}
	})
	put := testing.AllocsPerRun(500, func() {
		if err := tbl.Put(ctx, next(), row); err != nil {
			panic(err)
		}
	})
	t.Logf("allocs per op: Get %v, Put %v", get, put)
	require.Zero(t, get, "owned cache-hit Get allocates")
	require.Zero(t, put, "owned WriteBack Put allocates")
}
