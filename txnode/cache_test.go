package txnode

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The cache budget contract: the logical page cache never exceeds CacheBytes; when every
// frame is pinned a request fails with ErrCacheFull after CacheWait instead of hanging; a
// fill never overwrites a row committed while the miss was in flight.

// TestCacheBudget inserts far more rows than a 1 MiB cache holds, from several goroutines,
// then reads them back at random, sampling the cache's accounted bytes all along.
func TestCacheBudget(t *testing.T) {
	rows, writers, reads := 1_000_000, 4, 20_000
	if testing.Short() {
		// Under -race a remote miss is a slow round trip: 5000 of them still miss, fill and
		// evict thousands of times over a cache of a sixth of the rows.
		rows, reads = 100_000, 5_000
	}
	const budget = 1 << 20
	eachConfig(t, openConfigs(t), Options{CacheBytes: budget}, func(t *testing.T, db *DB) {
		ctx := context.Background()
		tb, err := db.CreateTable(ctx, "many", 64)
		require.NoError(t, err)

		var peak atomic.Int64
		done := make(chan struct{})
		var sampler sync.WaitGroup
		sampler.Add(1)
		go func() {
			defer sampler.Done()
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			for {
				peak.Store(max(peak.Load(), db.Stats().CacheBytes))
				select {
				case <-done:
					return
				case <-tick.C:
				}
			}
		}()

		var ids sync.Map // writer -> []uint64
		var wg sync.WaitGroup
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var mine []uint64
				row := make([]byte, 64)
				for len(mine) < rows/writers {
					n := min(1000, rows/writers-len(mine))
					var got []uint64
					err := db.Update(ctx, func(tx *Tx) error {
						got = got[:0]
						for range n {
							fillRow(row, uint64(len(mine)+len(got))<<8|uint64(w))
							id, err := tx.Insert(tb, row)
							if err != nil {
								return err
							}
							got = append(got, id)
						}
						return nil
					})
					if err != nil {
						t.Errorf("writer %d: %v", w, err)
						return
					}
					mine = append(mine, got...)
				}
				ids.Store(w, mine)
			}()
		}
		wg.Wait()
		require.False(t, t.Failed())

		// Random reads: nearly all miss, fill and evict.
		rng := rand.New(rand.NewPCG(1, 2))
		buf := make([]byte, 64)
		for range reads {
			w := rng.IntN(writers)
			v, _ := ids.Load(w)
			mine := v.([]uint64)
			i := rng.IntN(len(mine))
			require.NoError(t, tb.Get(ctx, mine[i], buf))
			require.Equal(t, uint64(i)<<8|uint64(w), checkRow(t, buf))
		}
		close(done)
		sampler.Wait()
		st := db.Stats()
		t.Logf("%d rows; peak cache bytes %d of %d; %+v", rows, peak.Load(), budget, st)
		require.LessOrEqual(t, peak.Load(), int64(budget))
		require.LessOrEqual(t, st.CacheBytes, int64(budget))
		require.Greater(t, st.Evictions, uint64(rows/64/2), "pages should have been evicted")
	})
}

// TestCacheFullFailsInTime pins every frame, with pin sets and then with open transactions:
// a further request must fail with ErrCacheFull after about CacheWait, not hang, and work
// again once the pins are released.
func TestCacheFullFailsInTime(t *testing.T) {
	const wait = 50 * time.Millisecond
	eachConfig(t, openConfigs(t), Options{CacheBytes: 256 << 10, CacheWait: wait}, func(t *testing.T, db *DB) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a hang fails
		defer cancel()
		tb, err := db.CreateTable(ctx, "pinned", 64)
		require.NoError(t, err)
		const pages = 200 // far more than 256 KiB holds (about 55 frames of 64-byte rows)
		for range pages {
			insertPageOf(t, ctx, db, tb, 1)
		}
		require.NoError(t, db.pipe.flush(ctx))
		lastRow := uint64(pages*64 - 1)

		// One pin set over everything: it cannot hold it all.
		start := time.Now()
		_, err = db.Pin(ctx, tb, 0, pages*64)
		require.ErrorIs(t, err, ErrCacheFull)
		require.GreaterOrEqual(t, time.Since(start), wait)

		// Pin sets of one page each, until the cache is full of them.
		var sets []*PinSet
		for page := uint64(0); ; page++ {
			ps, err := db.Pin(ctx, tb, page*64, page*64+1)
			if err != nil {
				require.ErrorIs(t, err, ErrCacheFull)
				break
			}
			sets = append(sets, ps)
		}
		t.Logf("%d pages pinned", len(sets))
		require.Less(t, len(sets), pages)
		buf := make([]byte, 64)
		expectFull := func(what string, f func() error) {
			t.Helper()
			start := time.Now()
			err := f()
			took := time.Since(start)
			require.ErrorIs(t, err, ErrCacheFull, what)
			require.GreaterOrEqual(t, took, wait, what)
			require.Less(t, took, 10*time.Second, what) // bounded, however slow the machine
		}
		expectFull("Get", func() error { return tb.Get(ctx, lastRow, buf) })
		expectFull("Put", func() error { return tb.Put(ctx, lastRow, buf) })
		expectFull("Update", func() error {
			return db.Update(ctx, func(tx *Tx) error { return tx.Get(tb, lastRow, buf) })
		})
		expectFull("Scan", func() error {
			for _, err := range tb.Scan(ctx, lastRow, lastRow+1) {
				return err
			}
			return nil
		})
		for _, ps := range sets {
			ps.Release()
		}
		require.NoError(t, tb.Get(ctx, lastRow, buf))

		// Open transactions holding one page each, until the cache is full of them.
		var txs []*Tx
		for page := uint64(0); page < pages; page++ {
			tx, err := db.Begin(ctx, false)
			require.NoError(t, err)
			if err := tx.Get(tb, page*64, buf); err != nil {
				require.ErrorIs(t, err, ErrCacheFull)
				tx.Rollback()
				break
			}
			txs = append(txs, tx)
		}
		t.Logf("%d transactions open", len(txs))
		require.Less(t, len(txs), pages)
		expectFull("Get", func() error { return tb.Get(ctx, lastRow, buf) })
		expectFull("View", func() error {
			return db.View(ctx, func(tx *Tx) error { return tx.Get(tb, lastRow, buf) })
		})
		for _, tx := range txs {
			require.NoError(t, tx.Commit())
		}
		require.NoError(t, tb.Get(ctx, lastRow, buf))
	})
}

// TestFillKeepsNewerRow holds a miss's answer from the store while another goroutine writes
// the row, then lets the old answer arrive: the fill must leave the new row (or the deletion)
// as it is.
func TestFillKeepsNewerRow(t *testing.T) {
	for _, mode := range []Durability{Durable, WriteBack} {
		for _, del := range []bool{false, true} {
			name := map[Durability]string{Durable: "durable", WriteBack: "writeback"}[mode]
			if del {
				name += "/delete"
			} else {
				name += "/put"
			}
			t.Run(name, func(t *testing.T) {
				ctx := context.Background()
				dir := t.TempDir()
				db, err := Open(ctx, Options{Dir: dir, SyncMode: "none"})
				require.NoError(t, err)
				tb, err := db.CreateTable(ctx, "t", 64)
				require.NoError(t, err)
				var ids []uint64
				for i := range 10 {
					id, err := tb.Insert(ctx, u64Row(64, uint64(100+i)))
					require.NoError(t, err)
					ids = append(ids, id)
				}
				require.NoError(t, db.Close(ctx))

				// Reopen cold over a store that holds back the first read.
				held := newHeldReadStore(newLocalStore(t, dir))
				db, err = Open(ctx, Options{Store: held, Durability: mode})
				require.NoError(t, err)
				defer db.Close(ctx)
				tb, err = db.Table(ctx, "t")
				require.NoError(t, err)
				id := ids[3]

				held.armed.Store(true)
				type result struct {
					v   uint64
					err error
				}
				res := make(chan result, 1)
				go func() {
					buf := make([]byte, 64)
					err := tb.Get(ctx, id, buf)
					res <- result{binary.LittleEndian.Uint64(buf), err}
				}()
				recvWithin(t, held.entered, "the held read") // the miss has read the old row and is held

				if del {
					require.NoError(t, tb.Delete(ctx, id))
				} else {
					require.NoError(t, tb.Put(ctx, id, u64Row(64, 999)))
				}
				close(held.release) // the old row arrives now
				r := recvWithin(t, res, "the held Get")

				buf := make([]byte, 64)
				check := func(what string, v uint64, err error) {
					t.Helper()
					if del {
						require.ErrorIs(t, err, ErrNotFound, what)
						return
					}
					require.NoError(t, err, what)
					require.Equal(t, uint64(999), v, what)
				}
				// The held Get ran with the write or after it: it sees the write.
				check("held read", r.v, r.err)
				err = tb.Get(ctx, id, buf)
				check("read after", binary.LittleEndian.Uint64(buf), err)
				require.NoError(t, db.View(ctx, func(tx *Tx) error {
					err := tx.Get(tb, id, buf)
					check("read in a transaction", binary.LittleEndian.Uint64(buf), err)
					return nil
				}))
				// Its neighbours came with the old answer and are right.
				require.NoError(t, tb.Get(ctx, ids[4], buf))
				require.Equal(t, uint64(104), checkRow(t, buf))

				require.NoError(t, db.Close(ctx))
				db, err = Open(ctx, Options{Dir: dir, SyncMode: "none"})
				require.NoError(t, err)
				defer db.Close(ctx)
				tb, err = db.Table(ctx, "t")
				require.NoError(t, err)
				err = tb.Get(ctx, id, buf)
				check("read after reopen", binary.LittleEndian.Uint64(buf), err)
			})
		}
	}
}

// TestInsertAfterEviction inserts into a page of granted ids whose frame was evicted after
// earlier inserts into it reached the store: the new frame must not claim the page empty.
// (It did: a fresh frame was made with every slot valid and absent, hiding the earlier rows.)
func TestInsertAfterEviction(t *testing.T) {
	eachConfig(t, openConfigs(t), Options{CacheBytes: minCacheBytes}, func(t *testing.T, db *DB) {
		ctx := context.Background()
		a, err := db.CreateTable(ctx, "a", 64)
		require.NoError(t, err)
		b, err := db.CreateTable(ctx, "b", 64)
		require.NoError(t, err)
		first, err := a.Insert(ctx, u64Row(64, 1))
		require.NoError(t, err)
		// Enough other pages to evict a's page (the cache holds about 13 frames).
		for range 40 {
			insertPageOf(t, ctx, db, b, 2)
			require.NoError(t, db.pipe.flush(ctx))
		}
		require.Positive(t, db.Stats().Evictions)
		second, err := a.Insert(ctx, u64Row(64, 3))
		require.NoError(t, err)
		require.Equal(t, first/64, second/64, "same page")
		buf := make([]byte, 64)
		require.NoError(t, a.Get(ctx, first, buf), "the first row")
		require.Equal(t, uint64(1), checkRow(t, buf))
		var got []uint64
		for r, err := range a.Scan(ctx, 0, second+1) {
			require.NoError(t, err)
			got = append(got, r.ID)
		}
		require.Equal(t, []uint64{first, second}, got)
	})
}

// TestFarIDs reads and writes ids far beyond anything granted. They hold no row; their page
// numbers do not fit a page key (table<<32 | page), so they must never reach the cache: such
// a Get returned a row of another table.
func TestFarIDs(t *testing.T) {
	ctx := context.Background()
	db := openConfigs(t)[0].opener(t)(Options{})
	var tabs []*Table
	for _, name := range []string{"t1", "t2", "t3", "t4"} {
		tb, err := db.CreateTable(ctx, name, 64)
		require.NoError(t, err)
		tabs = append(tabs, tb)
	}
	// Two tables whose ids overlap bitwise: a page of a can spell b's page 0.
	var a, b *Table
	for _, x := range tabs {
		for _, y := range tabs {
			if x != y && y.t.id&x.t.id == x.t.id {
				a, b = x, y
			}
		}
	}
	require.NotNil(t, a)
	bid, err := b.Insert(ctx, u64Row(64, 42))
	require.NoError(t, err)
	far := uint64(b.t.id&^a.t.id) << 32 * 64
	buf := make([]byte, 64)
	for _, id := range []uint64{far, far + 1, 1 << 62, ^uint64(0)} {
		require.ErrorIs(t, a.Get(ctx, id, buf), ErrNotFound, "id %d", id)
		require.ErrorIs(t, a.Put(ctx, id, buf), ErrNotFound, "id %d", id)
		require.ErrorIs(t, a.Delete(ctx, id), ErrNotFound, "id %d", id)
		require.NoError(t, db.View(ctx, func(tx *Tx) error {
			require.ErrorIs(t, tx.Get(a, id, buf), ErrNotFound, "id %d", id)
			return nil
		}))
	}
	ps, err := db.Pin(ctx, a, 0, ^uint64(0))
	require.NoError(t, err)
	ps.Release()
	require.NoError(t, b.Get(ctx, bid, buf))
	require.Equal(t, uint64(42), checkRow(t, buf))
}

// insertPageOf inserts a page of rows of value v (64 of them) into tb in one transaction,
// failing the test on error.
func insertPageOf(t *testing.T, ctx context.Context, db *DB, tb *Table, v uint64) {
	t.Helper()
	require.NoError(t, db.Update(ctx, func(tx *Tx) error {
		for range 64 {
			if _, err := tx.Insert(tb, u64Row(64, v)); err != nil {
				return err
			}
		}
		return nil
	}))
}
