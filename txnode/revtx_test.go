package txnode

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/storenode"
)

// TestLeaseOfReadTableCheckedAtWriteCommit: a read-write transaction that read table a and
// writes only table b checks a's lease at commit too. Its reads of a are served from the
// cache once a was first touched; if a's lease ran out meanwhile another node may own a and
// have changed the rows read, and validation (local version words) cannot see that. On main
// c783a6d only the written tables' leases were checked at commit: the transfer committed.
func TestLeaseOfReadTableCheckedAtWriteCommit(t *testing.T) {
	ctx := context.Background()
	addr, _ := startStorageNodeWith(t, storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone, LeaseDuration: time.Hour})
	clock := &fakeLeaseClock{}
	clock.n.Store(int64(1000 * time.Hour))
	db, err := Open(ctx, Options{StoreAddr: addr, OwnerID: 79, clock: clock})
	require.NoError(t, err)
	defer db.Close(ctx)
	a, err := db.CreateTable(ctx, "a", 64)
	require.NoError(t, err)
	aids := insertRows(t, db, a, 2)
	clock.n.Add(int64(30 * time.Minute)) // a's lease (45 usable minutes) has 15 left
	b, err := db.CreateTable(ctx, "b", 64)
	require.NoError(t, err) // b's lease is live for 45 minutes from now
	bids := insertRows(t, db, b, 1)
	buf := make([]byte, 64)

	tx, err := db.Begin(ctx, true)
	require.NoError(t, err)
	defer tx.Rollback()
	require.NoError(t, tx.Get(a, aids[0], buf))
	clock.n.Add(int64(20 * time.Minute)) // a's lease ran out; b's has 25 minutes left
	require.NoError(t, tx.Get(a, aids[1], buf), "checked at the first touch of the table")
	require.NoError(t, tx.Put(b, bids[0], buf))
	require.ErrorIs(t, tx.Commit(), ErrLeaseExpired)
}

// TestGetEvictionStorm: lock-free Gets of three tables whose frames keep being evicted and
// reassigned to other pages and other row sizes (a 8-byte, a 64-byte and a 4096-byte table
// in a cache of a few frames), while writers rewrite rows: every row a Get returns is whole
// and its own (every word names the row id and one version). Held: a guard.
func TestGetEvictionStorm(t *testing.T) {
	ctx := context.Background()
	rounds := 3000
	if testing.Short() {
		rounds = 600
	}
	db := openEmbedded(t, t.TempDir(), Options{CacheBytes: 768 << 10})
	sizes := []int{8, 64, 4096}
	tbs := make([]*Table, len(sizes))
	ids := make([][]uint64, len(sizes))
	word := func(id, v uint64) uint64 { return id<<24 | v&(1<<24-1) }
	row := func(r int, id, v uint64) []byte {
		b := make([]byte, r)
		for o := 0; o < r; o += 8 {
			binary.LittleEndian.PutUint64(b[o:], word(id, v))
		}
		return b
	}
	for i, r := range sizes {
		tb, err := db.CreateTable(ctx, fmt.Sprintf("s%d", r), r)
		require.NoError(t, err)
		tbs[i] = tb
		n := 64 * 6 // six pages each: 1.6 MB of 4096-byte rows alone
		for j := 0; j < n; j++ {
			id, err := tb.Insert(ctx, row(r, 0, 0))
			require.NoError(t, err)
			require.NoError(t, tb.Put(ctx, id, row(r, id, 0)))
			ids[i] = append(ids[i], id)
		}
	}
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			bufs := [][]byte{make([]byte, 8), make([]byte, 64), make([]byte, 4096)}
			for i := 0; i < rounds; i++ {
				k := rng.IntN(len(sizes))
				id := ids[k][rng.IntN(len(ids[k]))]
				if g == 0 && i%4 == 0 {
					if err := tbs[k].Put(ctx, id, row(sizes[k], id, uint64(i))); err != nil {
						errc <- err
						return
					}
					continue
				}
				b := bufs[k]
				if err := tbs[k].Get(ctx, id, b); err != nil {
					errc <- err
					return
				}
				w0 := binary.LittleEndian.Uint64(b)
				if w0>>24 != id {
					errc <- fmt.Errorf("table %d row %d: read row %d's bytes", sizes[k], id, w0>>24)
					return
				}
				for o := 8; o < len(b); o += 8 {
					if w := binary.LittleEndian.Uint64(b[o:]); w != w0 {
						errc <- fmt.Errorf("table %d row %d: torn row, word %d is %x, word 0 %x", sizes[k], id, o/8, w, w0)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		require.NoError(t, err)
	}
	require.NoError(t, db.cache.verify())
	require.Greater(t, db.Stats().Evictions, uint64(0))
}

// TestSessionGoDropsMidLoad: sessions keep many asynchronous commits in flight (the remote
// store's commit queue long, its pooled batches recycled at a high rate) while the client
// side of the connection is cut three times, and a reader's cache misses (pooled remote reads)
// cross the cuts: every increment is applied exactly once, every batch once, and every row
// read is the one written. Held: a guard.
func TestSessionGoDropsMidLoad(t *testing.T) {
	ctx := context.Background()
	addr, srv := startIdentityNode(t, storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone})
	proxy := startHalfProxy(t, addr)
	db, err := Open(ctx, Options{StoreAddr: proxy.ln.Addr().String(), OwnerID: 0x78, CacheBytes: 256 << 10})
	require.NoError(t, err)
	defer db.Close(ctx)
	tb, err := db.CreateTable(ctx, "ctr", 64)
	require.NoError(t, err)
	big, err := db.CreateTable(ctx, "big", 64)
	require.NoError(t, err)
	bigN := 64 * 80 // 80 pages: more than the cache holds
	bigIDs := make([]uint64, 0, bigN)
	sess := db.Session()
	var ps []*Pending
	for i := 0; i < bigN; i++ {
		var id uint64
		ps = append(ps, sess.Go(ctx, func(tx *Tx) error {
			var err error
			id, err = tx.Insert(big, u64Row(64, 0))
			if err != nil {
				return err
			}
			return tx.Put(big, id, u64Row(64, id^0x5a5a))
		}))
		bigIDs = append(bigIDs, id)
	}
	for _, p := range ps {
		require.NoError(t, p.Wait(ctx))
	}

	sessions, per, window := 6, 400, 64
	if testing.Short() {
		sessions, per, window = 3, 150, 32
	}
	ids := make([]uint64, sessions)
	for w := range ids {
		ids[w], err = tb.Insert(ctx, row(0))
		require.NoError(t, err)
	}
	var total atomic.Int64
	cuts := map[int64]bool{int64(sessions * per / 4): true, int64(sessions * per / 2): true, int64(sessions * per * 3 / 4): true}
	stop := make(chan struct{})
	var wg, rwg sync.WaitGroup
	rwg.Add(1)
	go func() { // the reader: misses across the cuts
		defer rwg.Done()
		rng := rand.New(rand.NewPCG(3, 3))
		buf := make([]byte, 64)
		for {
			select {
			case <-stop:
				return
			default:
			}
			id := bigIDs[rng.IntN(len(bigIDs))]
			if err := big.Get(ctx, id, buf); err != nil {
				t.Errorf("get %d: %v", id, err)
				return
			}
			if got := binary.LittleEndian.Uint64(buf); got != id^0x5a5a {
				t.Errorf("get %d: row of %d", id, got^0x5a5a)
				return
			}
		}
	}()
	for w := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := db.Session()
			got := make([]byte, 64)
			var inflight []*Pending
			for range per {
				inflight = append(inflight, s.Go(ctx, func(tx *Tx) error {
					if err := tx.Get(tb, ids[w], got); err != nil {
						return err
					}
					return tx.Put(tb, ids[w], row(binary.LittleEndian.Uint64(got)+1))
				}))
				if len(inflight) > window {
					if err := inflight[0].Wait(ctx); err != nil {
						t.Errorf("session %d: %v", w, err)
						return
					}
					inflight = inflight[1:]
				}
				if n := total.Add(1); cuts[n] {
					proxy.cutClients()
				}
			}
			for _, p := range inflight {
				if err := p.Wait(ctx); err != nil {
					t.Errorf("session %d: %v", w, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	rwg.Wait()
	require.False(t, t.Failed())
	require.Equal(t, int64(3), proxy.cuts.Load())
	got := make([]byte, 64)
	for w, id := range ids {
		require.NoError(t, tb.Get(ctx, id, got))
		require.Equal(t, uint64(per), binary.LittleEndian.Uint64(got), "session %d", w)
	}
	require.NoError(t, db.Close(ctx))
	st := srv.Engine().Stats()
	g, err := srv.Engine().Acquire(tb.t.id, 0x78, 0)
	require.NoError(t, err)
	require.Equal(t, g.LastSeq, st.Commits, "every seq applied exactly once")
}
