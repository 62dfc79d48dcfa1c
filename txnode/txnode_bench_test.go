package txnode

import (
	"context"
	"encoding/binary"
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
)

// Benchmarks of the embedded node, 64-byte rows, every row cached (a 64 MiB cache over 4 MiB
// of rows) unless the name says otherwise. goroutines=N runs N goroutines in all with
// RunParallel (SetParallelism N/GOMAXPROCS); run with -cpu 1,2. Compare runs with benchstat.
//
//	go test ./txnode -run '^$' -bench . -cpu 1,2 -count 3

const benchRows = 64 << 10

type benchMode struct {
	name       string
	durability Durability
	sync       string
}

var benchModes = []benchMode{
	{"mode=durable/sync=none", Durable, "none"},
	{"mode=writeback/sync=none", WriteBack, "none"},
}

func benchOpen(b *testing.B, m benchMode, rows int) (*DB, *Table, []uint64) {
	b.Helper()
	return benchLoad(b, Options{Dir: b.TempDir(), SyncMode: m.sync, Durability: m.durability, CacheBytes: 64 << 20}, "bench", rows, 1024)
}

// benchLoad opens a DB with opts (closed when b ends), creates the table name of 64-byte rows
// and inserts rows zero rows, perTx to a transaction, all flushed to the store.
func benchLoad(b *testing.B, opts Options, name string, rows, perTx int) (*DB, *Table, []uint64) {
	b.Helper()
	ctx := context.Background()
	db, err := Open(ctx, opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close(ctx) })
	tb, err := db.CreateTable(ctx, name, 64)
	if err != nil {
		b.Fatal(err)
	}
	ids := make([]uint64, 0, rows)
	row := make([]byte, 64)
	for len(ids) < rows {
		err := db.Update(ctx, func(tx *Tx) error {
			for range min(perTx, rows-len(ids)) {
				id, err := tx.Insert(tb, row)
				if err != nil {
					return err
				}
				ids = append(ids, id)
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	if err := db.pipe.flush(ctx); err != nil {
		b.Fatal(err)
	}
	return db, tb, ids
}

// xorshift is a per-goroutine random id source that costs next to nothing.
type xorshift uint64

func (x *xorshift) next() uint64 {
	*x ^= *x << 13
	*x ^= *x >> 7
	*x ^= *x << 17
	return uint64(*x)
}

var benchSeed atomic.Uint64

func newXorshift() xorshift { return xorshift(benchSeed.Add(0x9E3779B97F4A7C15) | 1) }

// benchEachMode runs, as a sub-benchmark of each mode of modes, runBench of the operation op
// makes over a fresh DB of rows rows (benchOpen).
func benchEachMode(b *testing.B, modes []benchMode, rows int, op func(ctx context.Context, db *DB, tb *Table, ids []uint64) func(*xorshift, []byte) error) {
	for _, m := range modes {
		b.Run(m.name, func(b *testing.B) {
			db, tb, ids := benchOpen(b, m, rows)
			runBench(b, op(context.Background(), db, tb, ids))
		})
	}
}

// runBench runs op serially (goroutines=1, b.Loop) and from 128 goroutines (RunParallel).
func runBench(b *testing.B, op func(rng *xorshift, buf []byte) error) {
	for _, g := range []int{1, 128} {
		b.Run(fmt.Sprintf("goroutines=%d", g), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(64)
			if g == 1 {
				rng, buf := newXorshift(), make([]byte, 64)
				for b.Loop() {
					if err := op(&rng, buf); err != nil {
						b.Fatal(err)
					}
				}
				return
			}
			b.SetParallelism(max(1, g/runtime.GOMAXPROCS(0)))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				rng, buf := newXorshift(), make([]byte, 64)
				for pb.Next() {
					if err := op(&rng, buf); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

func BenchmarkGet(b *testing.B) {
	benchEachMode(b, benchModes, benchRows, func(ctx context.Context, _ *DB, tb *Table, ids []uint64) func(*xorshift, []byte) error {
		return func(rng *xorshift, buf []byte) error {
			return tb.Get(ctx, ids[rng.next()%uint64(len(ids))], buf)
		}
	})
}

func BenchmarkPut(b *testing.B) {
	modes := append(slices.Clone(benchModes), benchMode{"mode=durable/sync=always", Durable, "always"})
	benchEachMode(b, modes, benchRows, func(ctx context.Context, _ *DB, tb *Table, ids []uint64) func(*xorshift, []byte) error {
		return func(rng *xorshift, buf []byte) error {
			return tb.Put(ctx, ids[rng.next()%uint64(len(ids))], buf)
		}
	})
}

func BenchmarkUpdate(b *testing.B) {
	benchEachMode(b, benchModes, benchRows, func(ctx context.Context, _ *DB, tb *Table, ids []uint64) func(*xorshift, []byte) error {
		inc := func(row []byte) error {
			binary.LittleEndian.PutUint64(row, binary.LittleEndian.Uint64(row)+1)
			return nil
		}
		return func(rng *xorshift, _ []byte) error {
			return tb.Update(ctx, ids[rng.next()%uint64(len(ids))], inc)
		}
	})
}

func BenchmarkInsert(b *testing.B) {
	benchEachMode(b, benchModes, 0, func(ctx context.Context, _ *DB, tb *Table, _ []uint64) func(*xorshift, []byte) error {
		return func(_ *xorshift, buf []byte) error {
			_, err := tb.Insert(ctx, buf)
			return err
		}
	})
}

// BenchmarkTransfer is a two-row read-write transaction: move one unit between two random
// rows.
func BenchmarkTransfer(b *testing.B) {
	benchEachMode(b, benchModes, benchRows, func(ctx context.Context, db *DB, tb *Table, ids []uint64) func(*xorshift, []byte) error {
		return func(rng *xorshift, buf []byte) error {
			from, to := ids[rng.next()%uint64(len(ids))], ids[rng.next()%uint64(len(ids))]
			if from == to {
				return nil
			}
			return db.Update(ctx, func(tx *Tx) error {
				if err := tx.Update(tb, from, func(row []byte) error {
					binary.LittleEndian.PutUint64(row, binary.LittleEndian.Uint64(row)-1)
					return nil
				}); err != nil {
					return err
				}
				return tx.Update(tb, to, func(row []byte) error {
					binary.LittleEndian.PutUint64(row, binary.LittleEndian.Uint64(row)+1)
					return nil
				})
			})
		}
	})
}

// BenchmarkSessionGo: one goroutine keeps asynchronous updates in flight, waiting for
// durability once per flushEvery.
func BenchmarkSessionGo(b *testing.B) {
	const flushEvery = 1024
	for _, m := range benchModes {
		b.Run(m.name, func(b *testing.B) {
			_, tb, ids := benchOpen(b, m, benchRows)
			ctx := context.Background()
			s := tb.db.Session()
			rng := newXorshift()
			b.ReportAllocs()
			b.SetBytes(64)
			n := 0
			for b.Loop() {
				id := ids[rng.next()%uint64(len(ids))]
				p := s.Go(ctx, func(tx *Tx) error {
					return tx.Update(tb, id, func(row []byte) error {
						binary.LittleEndian.PutUint64(row, binary.LittleEndian.Uint64(row)+1)
						return nil
					})
				})
				if p.err != nil {
					b.Fatal(p.err)
				}
				if n++; n%flushEvery == 0 {
					if err := s.Flush(ctx); err != nil {
						b.Fatal(err)
					}
				}
			}
			if err := s.Flush(ctx); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkScan scans 4096 cached rows per op, plain (Table.Scan) and in a transaction
// (Tx.Scan, which records its reads); ns/op is per 4096 rows.
func BenchmarkScan(b *testing.B) {
	const span = 4096
	for _, kind := range []string{"plain", "tx"} {
		b.Run("scan="+kind, func(b *testing.B) {
			db, tb, ids := benchOpen(b, benchModes[0], benchRows)
			ctx := context.Background()
			lo := ids[0]
			scan := func(seq func(func(Row, error) bool)) error {
				n := 0
				for _, err := range seq {
					if err != nil {
						return err
					}
					n++
				}
				if n != span {
					return fmt.Errorf("scanned %d rows, want %d", n, span)
				}
				return nil
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				var err error
				if kind == "plain" {
					err = scan(tb.Scan(ctx, lo, lo+span))
				} else {
					err = db.View(ctx, func(tx *Tx) error { return scan(tx.Scan(tb, lo, lo+span)) })
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
