package node_test

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster/node"
)

// A cluster table scans like a plain table (issue 23 item 4): every partition's rows in id
// order, this node's own partitions from its cache and the others' durable rows from their
// storage nodes, bounded by [lo, hi), stopped early on request.
func TestTableScanMergesPartitions(t *testing.T) {
	ctx := testCtx(t)
	tc, a, _, ta, tb, accts := bankSetup(t, 40)
	want := slices.Concat(accts[0], accts[1])
	slices.Sort(want)
	dst := make([]byte, 64)
	require.NoError(t, tb.Put(ctx, accts[1][3], balanceRow(777))) // b's, durable (Durable mode)
	require.NoError(t, ta.Get(ctx, accts[1][3], dst))

	scan := func(tbl *node.Table, lo, hi uint64) (ids []uint64, bal map[uint64]uint64) {
		bal = map[uint64]uint64{}
		for r, err := range tbl.Scan(ctx, lo, hi) {
			require.NoError(t, err)
			ids = append(ids, r.ID)
			bal[r.ID] = balanceOf(r.Data)
		}
		return ids, bal
	}
	for _, tbl := range []*node.Table{ta, tb} {
		ids, bal := scan(tbl, 0, ^uint64(0))
		require.Equal(t, want, ids, "every row, in id order, from both owners' partitions")
		require.EqualValues(t, 777, bal[accts[1][3]])
		require.EqualValues(t, initial, bal[accts[0][0]])
	}
	lo, hi := want[10], want[50]
	ids, _ := scan(ta, lo, hi)
	require.Equal(t, want[10:50], ids, "[lo, hi): hi excluded")

	var n int
	for _, err := range ta.ScanAll(ctx) {
		require.NoError(t, err)
		if n++; n == 5 {
			break
		}
	}
	require.Equal(t, 5, n)

	// A node that owns nothing scans every partition's durable rows.
	c := tc.open(t, 0xc, "")
	tcOwn, err := c.OpenTable(ctx, "acct")
	require.NoError(t, err)
	ids, bal := scan(tcOwn, 0, ^uint64(0))
	require.Equal(t, want, ids)
	require.EqualValues(t, 777, bal[accts[1][3]])

	empty, err := a.CreateTable(ctx, "empty", 64, 4, 1, tc.addrs)
	require.NoError(t, err)
	for _, err := range empty.ScanAll(ctx) {
		require.NoError(t, err)
		t.Fatal("a row in an empty table")
	}
}
