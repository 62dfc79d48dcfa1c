package txnode

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
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
	clock := &fakeLeaseClock{}
	db := openHourLeaseDB(t, ctx, 79, clock)
	a, aids := newTableRows(t, ctx, db, "a", 2)
	clock.n.Add(int64(30 * time.Minute)) // a's lease (45 usable minutes) has 15 left
	b, err := db.CreateTable(ctx, "b", 64)
	require.NoError(t, err) // b's lease is live for 45 minutes from now
	bids := insertRows(t, db, b, 1)
	buf := make([]byte, 64)

	tx := openTx(t, ctx, db, true)
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
			id := insertRow(t, ctx, tb, row(r, 0, 0))
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
	db := openDB(t, ctx, Options{StoreAddr: proxy.ln.Addr().String(), OwnerID: 0x78, CacheBytes: 256 << 10})
	defer db.Close(ctx)
	tb := newTable(t, ctx, db, "ctr", 64)
	big := newTable(t, ctx, db, "big", 64)
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
		ids[w] = insertRow(t, ctx, tb, row(0))
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
	requireEachAppliedOnce(t, ctx, srv, db, tb, ids, per, 0x78, "session")
}

// gateProxy forwards client and storage node bytes; while paused it holds what the storage
// node sends (and reports on held that it holds some).
type gateProxy struct {
	proxyConns
	cond   *sync.Cond
	paused bool
	held   chan struct{}
	sent   chan struct{} // a token per chunk the client sent while paused
}

// coldPageZero opens a DB over a gate proxy to a fresh storage node, with a 64 KiB cache (opts
// adds to it), and in it the table name: 30 pages of rows (row i of value i), flushed, then
// pages 1 to 29 read, so page 0 is evicted. The caller closes the DB.
func coldPageZero(t *testing.T, ctx context.Context, name string, opts Options) (*gateProxy, *DB, *Table, []uint64) {
	t.Helper()
	addr, _ := startIdentityNode(t, storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone})
	proxy := startGateProxy(t, addr)
	opts.StoreAddr, opts.CacheBytes = proxy.ln.Addr().String(), 64<<10
	db := openDB(t, ctx, opts)
	tb := newTable(t, ctx, db, name, 64)
	ids := make([]uint64, 64*30)
	for i := range ids {
		ids[i] = insertRow(t, ctx, tb, u64Row(64, uint64(i)))
	}
	require.NoError(t, db.pipe.flush(ctx))
	buf := make([]byte, 64)
	for p := 1; p < 30; p++ { // page 0 evicted
		require.NoError(t, tb.Get(ctx, ids[64*p], buf))
	}
	return proxy, db, tb, ids
}

func startGateProxy(t *testing.T, target string) *gateProxy {
	p := &gateProxy{held: make(chan struct{}, 1), sent: make(chan struct{}, 1024)}
	p.ln = listenLoopback(t)
	p.cond = sync.NewCond(&p.mu)
	acceptPairs(p.ln, target, &p.wg, func(c, s net.Conn) {
		p.add(c, s)
		go p.pipe(s, c, false)
		go p.pipe(c, s, true)
	})
	t.Cleanup(func() {
		p.ln.Close()
		p.setPaused(false)
		p.closeConns()
	})
	return p
}

func (p *gateProxy) setPaused(v bool) {
	p.mu.Lock()
	p.paused = v
	p.cond.Broadcast()
	p.mu.Unlock()
}

func (p *gateProxy) pipe(dst, src net.Conn, gated bool) {
	defer p.wg.Done()
	defer dst.Close()
	buf := make([]byte, 64<<10)
	for {
		k, err := src.Read(buf)
		if k > 0 && !gated {
			p.mu.Lock()
			if p.paused {
				select {
				case p.sent <- struct{}{}:
				default:
				}
			}
			p.mu.Unlock()
		}
		if k > 0 && gated {
			p.mu.Lock()
			for p.paused {
				select {
				case p.held <- struct{}{}:
				default:
				}
				p.cond.Wait()
			}
			p.mu.Unlock()
		}
		if k > 0 {
			if _, werr := dst.Write(buf[:k]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// TestAbandonedReadLateReply: a cache miss whose caller gave up (context cancelled while the
// storage node's reply was held back) leaves its frame, which other misses take for other
// pages; the late reply then arrives first on the connection and must fill nothing: every
// page read afterwards holds its own rows. Held: a guard of the pooled remote read (an
// abandoned read is never reused, its reply dropped; with onReply's abandoned check removed
// it fails: the late reply fills the pooled fetch's next frame, another page's slot).
func TestAbandonedReadLateReply(t *testing.T) {
	ctx := context.Background()
	addr, _ := startIdentityNode(t, storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone})
	proxy := startGateProxy(t, addr)
	db := openDB(t, ctx, Options{StoreAddr: proxy.ln.Addr().String(), CacheBytes: 64 << 10, CacheWait: time.Minute})
	defer db.Close(ctx)
	tb := newTable(t, ctx, db, "late", 64)
	pages := 40
	ids := make([]uint64, 64*pages)
	for i := range ids {
		ids[i] = insertRow(t, ctx, tb, u64Row(64, uint64(i)))
		require.NoError(t, tb.Put(ctx, ids[i], u64Row(64, ids[i]^0xfeed)))
	}
	require.NoError(t, db.pipe.flush(ctx))
	for round := range 3 {
		// Evict page 0 (read 30 others), then miss on it with the reply held back.
		buf := make([]byte, 64)
		for p := 1; p <= 30; p++ {
			require.NoError(t, tb.Get(ctx, ids[64*p+round], buf))
		}
		proxy.setPaused(true)
		cctx, cancel := context.WithCancel(ctx)
		got := make(chan error, 1)
		go func() { got <- tb.Get(cctx, ids[round], make([]byte, 64)) }()
		<-proxy.held
		key0 := pageKey(tb.t.id, ids[round]/64)
		_, m0 := db.cache.lookup(key0)
		require.NotNil(t, m0, "page 0's frame is pinned by its miss")
		cancel()
		require.ErrorIs(t, <-got, context.Canceled)
		for len(proxy.sent) > 0 {
			<-proxy.sent
		}
		// Misses on 20 other pages (more than the cache holds): one takes page 0's frame.
		var wg sync.WaitGroup
		errs := make(chan error, 20)
		for p := 0; p < 20; p++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id := ids[64*(20+p)+round] // the slot the late reply holds
				b := make([]byte, 64)
				if err := tb.Get(ctx, id, b); err != nil {
					errs <- err
					return
				}
				if v := binary.LittleEndian.Uint64(b); v != id^0xfeed {
					errs <- fmt.Errorf("row %d holds row %d's bytes", id, v^0xfeed)
				}
			}()
		}
		// Until page 0's frame holds another page and that page's miss went out.
		bound := time.NewTimer(30 * time.Second)
		for k := m0.key.Load(); k == key0 || k == 0; k = m0.key.Load() {
			select {
			case <-proxy.sent:
			case <-bound.C:
				t.Fatal("page 0's frame was not taken for another page")
			}
		}
		bound.Stop()
		proxy.setPaused(false)
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		for _, id := range ids {
			require.NoError(t, tb.Get(ctx, id, buf))
			require.Equal(t, id^0xfeed, binary.LittleEndian.Uint64(buf), "row %d", id)
		}
	}
}

// TestFiredRequestTimeoutNotReused: a cache miss with a context that has no deadline is
// bounded by RequestTimeout through a pooled timer context; one that fired (the reply held
// back past it) is closed for good and must never serve another read: every later miss
// (fresh timer contexts) succeeds. Held: a guard (fails if a fired timerCtx goes back to
// the pool: every later Read ends at once with DeadlineExceeded).
func TestFiredRequestTimeoutNotReused(t *testing.T) {
	ctx := context.Background()
	proxy, db, tb, ids := coldPageZero(t, ctx, "fired", Options{RequestTimeout: 500 * time.Millisecond})
	defer db.Close(ctx)
	buf := make([]byte, 64)
	proxy.setPaused(true)
	require.ErrorIs(t, tb.Get(ctx, ids[0], buf), context.DeadlineExceeded)
	proxy.setPaused(false)
	for i := 0; i < 200; i++ {
		id := ids[(i*977)%len(ids)]
		require.NoError(t, tb.Get(ctx, id, buf), "miss %d after the fired one", i)
		require.Equal(t, uint64((i*977)%len(ids)), binary.LittleEndian.Uint64(buf))
	}
}

// TestPlainScanStopsAtLeaseEnd: a Table.Scan (no transaction, nothing validated at a commit)
// serves each page under a live lease: once the lease runs out while the caller's loop is
// still going, the scan ends with ErrLeaseExpired before its next page. On main c783a6d (and
// 26994d0) the lease was checked only when the scan started: it went on serving cached rows
// for as long as the loop ran.
func TestPlainScanStopsAtLeaseEnd(t *testing.T) {
	ctx := context.Background()
	clock := &fakeLeaseClock{}
	db := openHourLeaseDB(t, ctx, 80, clock)
	tb := newTable(t, ctx, db, "ps", 64)
	ids := insertRows(t, db, tb, 64*3)
	n := 0
	var last error
	for row, err := range tb.ScanAll(ctx) {
		if err != nil {
			last = err
			break
		}
		n++
		if row.ID == ids[0] {
			clock.n.Add(int64(46 * time.Minute)) // the lease ran out while the loop works
		}
	}
	require.ErrorIs(t, last, ErrLeaseExpired)
	require.LessOrEqual(t, n, 64, "rows of later pages served after the lease ran out")
}
