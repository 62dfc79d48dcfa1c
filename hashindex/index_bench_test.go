package hashindex_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/hashindex"
	"github.com/weftdb/weft/internal/testkit"
	"github.com/weftdb/weft/txnode"
)

// playerName is a 16-byte key: a name padded with zeros.
func playerName(i int) []byte {
	k := make([]byte, 16)
	copy(k, fmt.Sprintf("player%d", i))
	return k
}

// lookupFixture is a players table of 64-byte rows and a unique name index over it, every
// row and bucket cached.
type lookupFixture struct {
	db      *txnode.DB
	players *txnode.Table
	names   *hashindex.Index
	ids     []uint64
}

func newLookupFixture(tb testing.TB, rows int) *lookupFixture {
	ctx := context.Background()
	db, err := txnode.Open(ctx, txnode.Options{Dir: tb.TempDir(), SyncMode: "none"})
	require.NoError(tb, err)
	tb.Cleanup(func() { db.Close(ctx) })
	players, err := db.CreateTable(ctx, "players", 64)
	require.NoError(tb, err)
	names, err := hashindex.Create(ctx, db, "players.name", hashindex.Options{KeyBytes: 16, Unique: true})
	require.NoError(tb, err)
	f := &lookupFixture{db: db, players: players, names: names, ids: make([]uint64, rows)}
	row := make([]byte, 64)
	for lo := 0; lo < rows; lo += 500 {
		require.NoError(tb, db.Update(ctx, func(tx *txnode.Tx) error {
			for i := lo; i < min(rows, lo+500); i++ {
				binary.LittleEndian.PutUint64(row, uint64(i))
				id, err := tx.Insert(players, row)
				if err != nil {
					return err
				}
				if err := names.TxInsert(tx, playerName(i), id); err != nil {
					return err
				}
				f.ids[i] = id
			}
			return nil
		}))
	}
	for i := range rows { // warm the cache and the directory
		id, err := names.Lookup(ctx, playerName(i))
		require.NoError(tb, err)
		require.Equal(tb, f.ids[i], id)
		require.NoError(tb, players.Get(ctx, id, row))
	}
	return f
}

// BenchmarkLookup compares a cache-hit Lookup of a unique index with a row Get of the table
// it indexes, in the same run; TxLookup is the same lookup inside a read-only transaction.
// cpu-ns/op is the process's CPU time per op: on a shared machine ns/op measures the share
// of the cores the run got.
//
//	go test ./hashindex -run '^$' -bench Lookup -benchmem -count 3
func BenchmarkLookup(b *testing.B) {
	ctx := context.Background()
	const rows = 50_000
	f := newLookupFixture(b, rows)
	st, err := f.names.Verify(ctx)
	require.NoError(b, err)
	b.Logf("%d keys: %d buckets, %d overflow rows, %d of %d buckets in one row, %d entries a row",
		st.Entries, st.Buckets, st.OverflowRows, st.OneRowBuckets, st.Buckets, st.EntriesPerRow)
	flat := make([]byte, 16*rows) // keys side by side, like the ids: one miss each at most
	for i := range rows {
		copy(flat[16*i:], playerName(i))
	}
	// Rows picked by an inline generator (an array of random picks would add its own cache
	// misses), among the first set of them: hot sets whose bucket rows fit the L2 cache (512)
	// or not (4096 rows of 256 bytes), and all.
	next := func(x *uint64, set int) int {
		*x = *x*6364136223846793005 + 1442695040888963407
		return int((*x >> 33) % uint64(set))
	}
	for _, set := range []int{512, 4096, rows} {
		b.Run(fmt.Sprintf("rows=%d/op=Get", set), func(b *testing.B) {
			row := make([]byte, 64)
			b.ReportAllocs()
			x := uint64(1)
			cpu0 := testkit.ProcessCPU()
			for b.Loop() {
				if err := f.players.Get(ctx, f.ids[next(&x, set)], row); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(testkit.ProcessCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		})
		b.Run(fmt.Sprintf("rows=%d/op=Lookup", set), func(b *testing.B) {
			b.ReportAllocs()
			x := uint64(1)
			cpu0 := testkit.ProcessCPU()
			for b.Loop() {
				i := next(&x, set)
				if _, err := f.names.Lookup(ctx, flat[16*i:16*i+16]); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(testkit.ProcessCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		})
		b.Run(fmt.Sprintf("rows=%d/op=TxLookup", set), func(b *testing.B) {
			b.ReportAllocs()
			x := uint64(1)
			for b.Loop() {
				i := next(&x, set)
				err := f.db.View(ctx, func(tx *txnode.Tx) error {
					_, err := f.names.TxLookup(tx, flat[16*i:16*i+16])
					return err
				})
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
