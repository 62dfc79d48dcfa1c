//go:build unix

package clustertest_test

import (
	"cmp"
	"context"
	"encoding/binary"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster/clustertest"
	"github.com/weftdb/weft/cluster/node"
)

// TestHelperProcess is every child of these tests (clustertest.HelperTest).
func TestHelperProcess(t *testing.T) { clustertest.HelperProcess(t) }

// testCtx bounds every wait of a test.
func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// setupOwner is the owner id of the in-process node that creates the tables.
const setupOwner = 0x5e

// createRows creates table name (64-byte rows, parts partitions of one-page stripes,
// partition p on storage node p%len) and perPart rows of value v in every partition, through
// an in-process node that then closes (releasing every partition). It returns the ids, and
// the rows' partitions, sorted by partition.
func createRows(t *testing.T, c *clustertest.Cluster, name string, parts, perPart int, v uint64) []uint64 {
	t.Helper()
	ctx := testCtx(t, 60*time.Second)
	n := c.OpenNode(setupOwner, "")
	tbl, err := n.CreateTable(ctx, name, 64, parts, 1, c.Addrs())
	require.NoError(t, err)
	all := make([]uint32, parts)
	for p := range all {
		all[p] = uint32(p)
	}
	require.NoError(t, tbl.Own(ctx, all...))
	var ids []uint64
	for range parts * perPart {
		id, err := tbl.Insert(ctx, u64Row(v))
		require.NoError(t, err)
		ids = append(ids, id)
	}
	require.NoError(t, n.Close(ctx))
	// In partition order (one row per partition: ids[p] is partition p's).
	slices.SortStableFunc(ids, func(a, b uint64) int { return cmp.Compare(tbl.Partition(a), tbl.Partition(b)) })
	return ids
}

func u64Row(v uint64) []byte {
	b := make([]byte, 64)
	binary.LittleEndian.PutUint64(b, v)
	return b
}

// readU64 reads row id's first word from its storage node's durable rows (n owns nothing of
// the table).
func readU64(t *testing.T, ctx context.Context, tbl *node.Table, id uint64) uint64 {
	t.Helper()
	b := make([]byte, tbl.RowBytes())
	require.NoError(t, tbl.Get(ctx, id, b))
	return binary.LittleEndian.Uint64(b)
}

// parity returns the partitions p < n with p%2 == r.
func parity(n, r int) []uint32 {
	var out []uint32
	for p := r; p < n; p += 2 {
		out = append(out, uint32(p))
	}
	return out
}
