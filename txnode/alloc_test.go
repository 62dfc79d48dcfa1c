//go:build !race

package txnode

import (
	"context"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
)

// Cache hits allocate nothing: Get in both modes, Put and Update in WriteBack, and Put and
// Update in Durable as far as the transaction node goes (the commit pipeline reuses its
// batches and waiters). The embedded store's own commit path allocates per batch (its WAL
// callback closure), so Durable writes are measured twice: over a store that acknowledges at
// once (the node's own allocations: none) and over the embedded store (reported).

func allocSetup(t *testing.T, opts Options) (*DB, *Table, []uint64) {
	t.Helper()
	ctx := context.Background()
	db, err := Open(ctx, opts)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close(ctx) })
	tb, err := db.CreateTable(ctx, "alloc", 64)
	require.NoError(t, err)
	ids := make([]uint64, 256)
	for i := range ids {
		ids[i], err = tb.Insert(ctx, u64Row(64, uint64(i)))
		require.NoError(t, err)
	}
	return db, tb, ids
}

func TestAllocs(t *testing.T) {
	ctx := context.Background()
	stores := []struct {
		name string
		open func(t *testing.T, mode Durability) (*DB, *Table, []uint64)
		// commitsAlloc: Durable writes over this store may allocate (the store's own).
		commitsAlloc bool
	}{
		{"embedded", func(t *testing.T, mode Durability) (*DB, *Table, []uint64) {
			return allocSetup(t, Options{Dir: t.TempDir(), SyncMode: "none", Durability: mode})
		}, true},
		{"ackstore", func(t *testing.T, mode Durability) (*DB, *Table, []uint64) {
			return allocSetup(t, Options{Store: &ackStore{Store: newLocalStore(t, "")}, Durability: mode})
		}, false},
	}
	for _, st := range stores {
		for _, mode := range []Durability{Durable, WriteBack} {
			name := st.name + "/durable"
			if mode == WriteBack {
				name = st.name + "/writeback"
			}
			t.Run(name, func(t *testing.T) {
				db, tb, ids := st.open(t, mode)
				buf := make([]byte, 64)
				row := u64Row(64, 7)
				inc := func(r []byte) error {
					binary.LittleEndian.PutUint64(r[8:], binary.LittleEndian.Uint64(r[8:])+1)
					return nil
				}
				// Warm: every row cached, every pool and buffer grown.
				for range 3 {
					for _, id := range ids {
						require.NoError(t, tb.Get(ctx, id, buf))
						require.NoError(t, tb.Put(ctx, id, row))
						require.NoError(t, tb.Update(ctx, id, inc))
					}
				}
				require.NoError(t, db.pipe.flush(ctx))
				i := 0
				next := func() uint64 { i++; return ids[i%len(ids)] }

				get := testing.AllocsPerRun(1000, func() {
					if err := tb.Get(ctx, next(), buf); err != nil {
						panic(err)
					}
				})
				put := testing.AllocsPerRun(1000, func() {
					if err := tb.Put(ctx, next(), row); err != nil {
						panic(err)
					}
				})
				update := testing.AllocsPerRun(1000, func() {
					if err := tb.Update(ctx, next(), inc); err != nil {
						panic(err)
					}
				})
				// A read-only transaction of two cache-hit Tx.Gets (the pooled Tx of getSlow and
				// retry: pin, read, validate, lease check, unpin).
				txGet := testing.AllocsPerRun(1000, func() {
					tx, err := db.beginTx(ctx, false)
					if err != nil {
						panic(err)
					}
					for range 2 {
						if err := tx.Get(tb, next(), buf); err != nil {
							panic(err)
						}
					}
					if _, err := tx.commit(); err != nil {
						panic(err)
					}
					tx.release()
				})
				t.Logf("allocs per op: Get %v, Tx.Get %v, Put %v, Update %v", get, txGet, put, update)
				require.Zero(t, get, "cache-hit Get allocates")
				require.Zero(t, txGet, "cache-hit Tx.Get allocates")
				if mode == Durable && st.commitsAlloc {
					return // reported above; the store's commit path is not this package's
				}
				require.Zero(t, put, "cache-hit Put allocates")
				require.Zero(t, update, "cache-hit Update allocates")
			})
		}
	}
}
