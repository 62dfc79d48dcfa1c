//go:build !race

package txnode

import (
	"context"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
)

// Cache hits allocate nothing: Get in both modes, Put and Update in both modes, over the
// embedded store (whose commit allocates nothing either) and over a store that acknowledges
// at once (the node's own allocations).

func allocSetup(t *testing.T, opts Options) (*DB, *Table, []uint64) {
	t.Helper()
	ctx := context.Background()
	db := openDB(t, ctx, opts)
	t.Cleanup(func() { db.Close(ctx) })
	tb := newTable(t, ctx, db, "alloc", 64)
	ids := make([]uint64, 256)
	for i := range ids {
		ids[i] = insertRow(t, ctx, tb, u64Row(64, uint64(i)))
	}
	return db, tb, ids
}

func TestAllocs(t *testing.T) {
	ctx := context.Background()
	stores := []struct {
		name string
		open func(t *testing.T, mode Durability) (*DB, *Table, []uint64)
	}{
		{"embedded", func(t *testing.T, mode Durability) (*DB, *Table, []uint64) {
			return allocSetup(t, Options{Dir: t.TempDir(), SyncMode: "none", Durability: mode})
		}},
		{"ackstore", func(t *testing.T, mode Durability) (*DB, *Table, []uint64) {
			return allocSetup(t, Options{Store: &ackStore{Store: newLocalStore(t, "")}, Durability: mode})
		}},
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
				require.Zero(t, put, "cache-hit Put allocates")
				require.Zero(t, update, "cache-hit Update allocates")
			})
		}
	}
}

// TestRemoteMissAllocs guards the transaction node's side of the remote paths: a Get that
// fetches its row over TCP, and a Put that fetches and commits over TCP, allocate nothing in
// this process once warm (no request slice, closure, channel or context timer per read; the
// in-flight commit record, its slices and reply callback are pooled). The storage node runs
// in a helper process, so its allocations are not counted.
func TestRemoteMissAllocs(t *testing.T) {
	ctx := context.Background()
	dir, addr := t.TempDir(), freeLoopbackAddr(t)
	node := startNodeProc(t, dir, addr)
	defer node.kill()
	db := openDB(t, ctx, Options{StoreAddr: addr, CacheBytes: 64 << 10, OwnerID: 43})
	defer db.Close(ctx)
	tb := newTable(t, ctx, db, "misses", 64)
	ids := make([]uint64, 64*64) // 64 pages: four times what the cache holds
	for i := range ids {
		ids[i] = insertRow(t, ctx, tb, u64Row(64, uint64(i)))
	}
	buf := make([]byte, 64)
	row := u64Row(64, 7)
	i := 0
	next := func() uint64 { i += 977; return ids[i%len(ids)] } // a new page nearly every time
	get := func() {
		if err := tb.Get(ctx, next(), buf); err != nil {
			panic(err)
		}
	}
	put := func() {
		if err := tb.Put(ctx, next(), row); err != nil {
			panic(err)
		}
	}
	for range 300 {
		get()
		put()
	}
	misses := db.Stats().PageMisses
	gets := testing.AllocsPerRun(500, get)
	require.Greater(t, db.Stats().PageMisses-misses, uint64(400), "the Gets missed")
	puts := testing.AllocsPerRun(200, put)
	// A cancellable context without a deadline (a request's, the bench's) is bounded by the
	// pooled timerCtx too, and its parent watched without a registration per read.
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cancelGets := testing.AllocsPerRun(500, func() {
		if err := tb.Get(cctx, next(), buf); err != nil {
			panic(err)
		}
	})
	t.Logf("allocs per remote miss Get %v (cancellable context %v), per remote Put (a miss and a commit) %v", gets, cancelGets, puts)
	require.Zero(t, gets, "remote miss Get allocates")
	require.Zero(t, cancelGets, "remote miss Get with a cancellable context allocates")
	require.Zero(t, puts, "remote Put allocates")
}
