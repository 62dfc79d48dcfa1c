package txnode

import (
	"context"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/storenode"
)

// BenchmarkRemoteGetMiss measures random single-row Gets that miss a 1 MiB cache, over TCP to
// an in-process storage node (both on the same cores), 128 goroutines.
func BenchmarkRemoteGetMiss(b *testing.B) {
	ctx := context.Background()
	addr, _ := startStorageNodeWith(b, storenode.Options{Dir: b.TempDir(), Sync: storenode.SyncNone, LeaseDuration: time.Hour})
	db, err := Open(ctx, Options{StoreAddr: addr, CacheBytes: 1 << 20, OwnerID: 3, Durability: WriteBack})
	require.NoError(b, err)
	defer db.Close(ctx)
	t, err := db.CreateTable(ctx, "t", 64)
	require.NoError(b, err)
	const rows = 1 << 18 // 16 MiB of rows: a 1 MiB cache holds 1/20 of them
	s := db.Session()
	for i := range rows {
		s.Go(ctx, func(tx *Tx) error { _, err := tx.Insert(t, row(uint64(i))); return err })
	}
	require.NoError(b, s.Flush(ctx))
	var seed atomic.Uint64
	b.SetParallelism(64) // 128 goroutines on 2 cores
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		rng := rand.New(rand.NewPCG(seed.Add(1), 1))
		buf := make([]byte, 64)
		for pb.Next() {
			if err := t.Get(ctx, rng.Uint64N(rows), buf); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	st := db.Stats()
	b.ReportMetric(float64(st.PageMisses)/float64(b.N), "misses/op")
}

// BenchmarkRemoteUpdate measures random single-row Update (read-modify-write, Durable, sync
// none) over TCP with 128 goroutines, all rows cached.
func BenchmarkRemoteUpdate(b *testing.B) {
	ctx := context.Background()
	addr, _ := startStorageNodeWith(b, storenode.Options{Dir: b.TempDir(), Sync: storenode.SyncNone, LeaseDuration: time.Hour})
	db, err := Open(ctx, Options{StoreAddr: addr, CacheBytes: 256 << 20, OwnerID: 3})
	require.NoError(b, err)
	defer db.Close(ctx)
	t, err := db.CreateTable(ctx, "t", 64)
	require.NoError(b, err)
	const rows = 1 << 16
	s := db.Session()
	for i := range rows {
		s.Go(ctx, func(tx *Tx) error { _, err := tx.Insert(t, row(uint64(i))); return err })
	}
	require.NoError(b, s.Flush(ctx))
	var seed atomic.Uint64
	b.SetParallelism(64)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		rng := rand.New(rand.NewPCG(seed.Add(1), 2))
		bump := func(r []byte) error { r[8]++; return nil }
		for pb.Next() {
			if err := t.Update(ctx, rng.Uint64N(rows), bump); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	st := db.Stats()
	b.ReportMetric(st.TxPerBatch, "tx/batch")
}
