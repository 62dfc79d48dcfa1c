package txnode

import (
	"context"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
)

// A cluster table created with createDurableClusterTable takes no grant; a durableTable reads
// the store's rows without one (nothing cached, no ownership); the same name again is
// ErrTableExists, and openDurable tells its layout. servingErr reports a grant's loss.
func TestDurableTable(t *testing.T) {
	ctx := context.Background()
	const owner = 0x42
	g, st := grantStore(t, owner)
	db := openDB(t, ctx, Options{Store: st, OwnerID: owner, grants: g})
	defer db.Close(ctx)
	layout := base.ClusterLayout{Partitions: 2, StripePages: 1, Partition: 1}
	name := base.PartitionTableName("acct", 1)
	d, err := db.createDurableClusterTable(ctx, name, 64, layout)
	require.NoError(t, err)
	require.EqualValues(t, 0, g.calls.Load(), "no grant taken")
	require.Equal(t, layout, d.Cluster)
	require.Equal(t, 64, d.RowBytes)
	require.Equal(t, name, d.Name)
	_, err = db.createDurableClusterTable(ctx, name, 64, layout)
	require.ErrorIs(t, err, ErrTableExists)
	_, err = db.openDurable(ctx, "nope")
	require.ErrorIs(t, err, ErrTableNotFound)

	tb := openTable(t, ctx, db, name)
	require.NoError(t, tb.servingErr())
	id := insertRow(t, ctx, tb, row(7))
	d2, err := openDurable(ctx, db, name)
	require.NoError(t, err)
	dst := make([]byte, 64)
	require.NoError(t, d2.get(ctx, id, dst))
	require.Equal(t, row(7), dst)
	require.ErrorIs(t, d2.get(ctx, id+1, dst), ErrNotFound)
	require.ErrorIs(t, d2.get(ctx, ^uint64(0), dst), ErrNotFound)
	require.ErrorIs(t, d2.get(ctx, id, dst[:8]), ErrRowSize)
	require.EqualValues(t, 1, g.calls.Load())

	g.lost.Store(true)
	require.ErrorIs(t, tb.servingErr(), ErrLeaseExpired)
	require.NoError(t, d2.get(ctx, id, dst), "a durable read needs no grant")
	require.NoError(t, db.Close(ctx))
	require.ErrorIs(t, d2.get(ctx, id, dst), ErrClosed)
}

// durableTable.scan yields the store's rows of [lo, hi) in id order, skipping empty pages
// and the deleted rows, across page boundaries, and stops when asked.
func TestDurableTableScan(t *testing.T) {
	ctx := context.Background()
	db := openDB(t, ctx, Options{Dir: t.TempDir()})
	defer db.Close(ctx)
	tb := newTable(t, ctx, db, "items", 64)
	var ids []uint64
	row := make([]byte, 64)
	for i := range 300 {
		row[0] = byte(i)
		id := insertRow(t, ctx, tb, row)
		ids = append(ids, id)
	}
	for _, i := range []int{0, 63, 64, 150} {
		require.NoError(t, tb.Delete(ctx, ids[i]))
	}
	d, err := openDurable(ctx, db, "items")
	require.NoError(t, err)
	scan := func(lo, hi uint64) (got []uint64) {
		for r, err := range d.scan(ctx, lo, hi) {
			require.NoError(t, err)
			require.Equal(t, byte(slices.Index(ids, r.ID)), r.Data[0], "row %d", r.ID)
			got = append(got, r.ID)
		}
		return got
	}
	var want []uint64
	for i, id := range ids {
		if i != 0 && i != 63 && i != 64 && i != 150 {
			want = append(want, id)
		}
	}
	require.Equal(t, want, scan(0, ^uint64(0)))
	require.Equal(t, want[60:100], scan(want[60], want[100]))
	n := 0
	for range d.scan(ctx, 0, ^uint64(0)) {
		if n++; n == 3 {
			break
		}
	}
	require.Equal(t, 3, n)
}

// openDurable opens name for durable reads, as txncoord.OpenDurable does.
func openDurable(ctx context.Context, db *DB, name string) (*durableTable, error) {
	ti, err := db.openDurable(ctx, name)
	if err != nil {
		return nil, err
	}
	return &durableTable{DB: db, Info: ti}, nil
}
