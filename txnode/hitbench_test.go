//go:build linux

package txnode

import (
	"context"
	"runtime"
	"testing"

	"github.com/weftdb/weft/internal/testkit"
)

// BenchmarkGetLarge is the cache-hit read at a size that misses the CPU caches: 4M rows of 64
// bytes (256 MiB of rows, 64K frames) in a 1 GiB cache, every row cached, random ids, 128
// goroutines. op=get is Table.Get's lock-free path; op=tx is a read-only transaction of one
// Tx.Get (pin, read, validate, unpin). The table is loaded once per -count round. Compare by
// CPU time per op (benchstat on -count runs): the machine is shared.
//
//	go test ./txnode -run '^$' -bench GetLarge -count 5 -benchtime 2s
func BenchmarkGetLarge(b *testing.B) {
	db, tb, ids := largeOpen(b)
	ctx := context.Background()
	ops := []struct {
		name string
		op   func(id uint64, buf []byte) error
	}{
		{"op=get", func(id uint64, buf []byte) error { return tb.Get(ctx, id, buf) }},
		{"op=tx", func(id uint64, buf []byte) error {
			tx, err := db.beginTx(ctx, false)
			if err != nil {
				return err
			}
			err = tx.Get(tb, id, buf)
			if err == nil {
				_, err = tx.commit()
			}
			tx.release()
			return err
		}},
	}
	for _, o := range ops {
		b.Run(o.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(max(1, 128/runtime.GOMAXPROCS(0)))
			cpu0 := testkit.ProcessCPU()
			b.RunParallel(func(pb *testing.PB) {
				rng, buf := newXorshift(), make([]byte, 64)
				for pb.Next() {
					if err := o.op(ids[rng.next()%uint64(len(ids))], buf); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(testkit.ProcessCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

const largeRows = 4 << 20

// largeOpen loads the table of BenchmarkGetLarge (once per -count round).
func largeOpen(b *testing.B) (*DB, *Table, []uint64) {
	b.Helper()
	return benchLoad(b, Options{Dir: b.TempDir(), SyncMode: "none", CacheBytes: 1 << 30}, "large", largeRows, 4096)
}
