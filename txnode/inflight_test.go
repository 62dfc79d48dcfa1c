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
	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/txnode/store"
)

// Frames with rows in flight are evictable (issue 13): a batch owns a copy of its rows, and a
// later miss on such a row waits for the batch's acknowledgement, because the store answers
// reads ahead of queued commits (with the older row). These tests hold acknowledgements back
// with flightStore and re-read evicted pages meanwhile.

// flightStore holds commit batches back (neither applied nor acknowledged) until they are let
// through, in seq order, while it answers reads from the store underneath, which has only the
// rows of the batches let through: the older durable rows, as a storage node answers reads
// ahead of the commits queued before them.
type flightStore struct {
	store.Store
	mu        sync.Mutex
	cond      *sync.Cond
	queue     []heldCommit
	allow     int  // batches that may pass now
	open      bool // every batch passes
	closed    bool
	held      atomic.Int64 // batches that waited in the queue
	forwarded atomic.Int64
	reads     atomic.Int64
	// onRead, when set, runs after each read is answered (the test's release policy).
	onRead func()
	wg     sync.WaitGroup
}

type heldCommit struct {
	b    *base.Batch
	done func(uint64, error)
}

func newFlightStore(t *testing.T, s store.Store) *flightStore {
	fs := &flightStore{Store: s, open: true}
	fs.cond = sync.NewCond(&fs.mu)
	fs.wg.Add(1)
	go fs.forwarder()
	t.Cleanup(fs.stop)
	return fs
}

func (fs *flightStore) Commit(b *base.Batch, done func(uint64, error)) {
	fs.mu.Lock()
	fs.queue = append(fs.queue, heldCommit{b, done})
	if !fs.open {
		fs.held.Add(1)
	}
	fs.cond.Broadcast()
	fs.mu.Unlock()
}

func (fs *flightStore) Read(ctx context.Context, reqs []base.PageWant, fill func(int, uint64, uint64, []byte)) error {
	err := fs.Store.Read(ctx, reqs, fill)
	fs.reads.Add(1)
	if fs.onRead != nil {
		fs.onRead()
	}
	return err
}

// hold stops batches from passing (those let through already still pass).
func (fs *flightStore) hold() {
	fs.mu.Lock()
	fs.open = false
	fs.mu.Unlock()
}

// release lets every batch queued now through and the next two to come (a goroutine about to
// wait may wait for the open batch, or for the next WriteBack epoch), and holds later ones
// again.
func (fs *flightStore) release() {
	fs.mu.Lock()
	fs.allow = len(fs.queue) + 2
	fs.cond.Broadcast()
	fs.mu.Unlock()
}

// releaseOne lets the oldest queued batch through, if any.
func (fs *flightStore) releaseOne() {
	fs.mu.Lock()
	fs.allow = min(fs.allow+1, len(fs.queue))
	fs.cond.Broadcast()
	fs.mu.Unlock()
}

// openAll lets every batch through from now on.
func (fs *flightStore) openAll() {
	fs.mu.Lock()
	fs.open = true
	fs.cond.Broadcast()
	fs.mu.Unlock()
}

func (fs *flightStore) queued() int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return len(fs.queue)
}

func (fs *flightStore) stop() {
	fs.mu.Lock()
	fs.closed = true
	fs.open = true
	fs.cond.Broadcast()
	fs.mu.Unlock()
	fs.wg.Wait()
}

// forwarder hands the batches let through to the store underneath, one at a time in the
// order they came (an owner's seq order), and acknowledges each once the store has and its
// Commit has returned.
func (fs *flightStore) forwarder() {
	defer fs.wg.Done()
	for {
		fs.mu.Lock()
		for len(fs.queue) == 0 || (!fs.open && fs.allow == 0) {
			if fs.closed && len(fs.queue) == 0 {
				fs.mu.Unlock()
				return
			}
			fs.cond.Wait()
		}
		h := fs.queue[0]
		fs.queue = fs.queue[1:]
		if fs.allow > 0 {
			fs.allow--
		}
		fs.mu.Unlock()
		type result struct {
			lsn uint64
			err error
		}
		ch := make(chan result, 1)
		fs.Store.Commit(h.b, func(lsn uint64, err error) { ch <- result{lsn, err} })
		fs.forwarded.Add(1)
		r := <-ch
		h.done(r.lsn, r.err)
	}
}

func incRow(row []byte) error {
	fillRow(row, binary.LittleEndian.Uint64(row)+1)
	return nil
}

// TestTinyCacheAsyncInFlight: with a 64 KiB cache (11 frames) and every acknowledgement held
// back, asynchronous transactions on four times as many pages all commit in memory: frames
// with rows in flight are evicted. Before, a frame with rows in flight was never evicted, so
// the twelfth page waited for a frame until its context ended (crudbench --async with a 1 MiB
// cache stalled at ~220 pages in flight). A Get of an evicted row still in flight then waits
// for its batch (the store underneath has only the older row) and returns the new one.
func TestTinyCacheAsyncInFlight(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	fs := newFlightStore(t, newLocalStore(t, ""))
	db := openDB(t, ctx, Options{Store: fs, CacheBytes: minCacheBytes, CacheWait: 2 * time.Minute})
	defer closeFlightDB(t, fs, db)
	const pages, workers = 48, 4
	tb, ids := flushedPages(t, ctx, db, pages)
	waits := make(chan string, 16)
	db.testHookWait = func(what string) {
		select {
		case waits <- what:
		default:
		}
	}
	before := db.Stats()
	fs.hold()
	forwarded := fs.forwarded.Load()

	var wg sync.WaitGroup
	pendings := make([][]*Pending, workers)
	for w := range workers {
		wg.Go(func() {
			s := db.Session()
			for page := w; page < pages; page += workers {
				id := ids[page*64+page%64]
				pendings[w] = append(pendings[w], s.Go(ctx, func(tx *Tx) error { return tx.Update(tb, id, incRow) }))
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	recvWithin(t, done, "the asynchronous transactions")
	for _, ps := range pendings {
		for _, p := range ps {
			require.NoError(t, p.err, "committed in memory, acknowledgements held")
		}
	}
	require.Equal(t, forwarded, fs.forwarded.Load(), "nothing reached the store")
	st := db.Stats()
	require.Equal(t, uint64(pages), st.Commits-before.Commits)
	require.Greater(t, st.Evictions, before.Evictions)
	require.NotZero(t, db.cache.ghostsMade.Load(), "frames with rows in flight were evicted")

	// A page whose frame went with its row in flight: a Get waits for the batch.
	page := -1
	for p := range pages {
		if _, m := db.cache.lookup(pageKey(tb.t.id, uint64(p))); m == nil {
			page = p
			break
		}
	}
	require.GreaterOrEqual(t, page, 0)
	id := ids[page*64+page%64]
	got := make(chan error, 1)
	buf := make([]byte, 64)
	go func() { got <- tb.Get(ctx, id, buf) }()
	require.Equal(t, "settle", recvWithin(t, waits, "the Get waiting for the batch of its row"))
	select {
	case err := <-got:
		require.FailNow(t, "the Get returned before its row's batch was acknowledged", "err %v, row %d", err, checkRow(t, buf))
	default:
	}
	fs.openAll()
	require.NoError(t, recvWithin(t, got, "the Get"))
	require.Equal(t, uint64(page*64+page%64+1), checkRow(t, buf), "the row of the batch, not the store's older one")

	for _, ps := range pendings {
		for _, p := range ps {
			require.NoError(t, p.Wait(ctx))
		}
	}
	for p := range pages {
		id := ids[p*64+p%64]
		require.NoError(t, tb.Get(ctx, id, buf))
		require.Equal(t, uint64(p*64+p%64+1), checkRow(t, buf), "row %d", id)
	}
	require.NoError(t, db.cache.verify())
}

// TestInflightBytesBound: Options.InflightBytes bounds the batches not yet acknowledged. With
// acknowledgements held, commits fill the bound; the next waits in the pipeline (its rows
// locked), its context ends the wait with nothing applied, and once the batches are
// acknowledged commits go on.
func TestInflightBytesBound(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	fs := newFlightStore(t, newLocalStore(t, ""))
	const perTx = 64 + segFlightBytes // one 64-byte row on a page of its own
	const fit = 5
	db := openDB(t, ctx, Options{Store: fs, InflightBytes: fit * perTx})
	defer closeFlightDB(t, fs, db)
	tb := newTable(t, ctx, db, "t", 64)
	ids := insertRows(t, db, tb, 64*(fit+2))
	require.NoError(t, db.pipe.flush(ctx))
	fs.hold()
	s := db.Session()
	var ps []*Pending
	for i := range fit {
		p := s.Go(ctx, func(tx *Tx) error { return tx.Update(tb, ids[i*64], incRow) })
		require.NoError(t, p.err)
		ps = append(ps, p)
	}
	db.pipe.mu.Lock()
	require.Equal(t, int64(fit*perTx), db.pipe.flightBytes)
	db.pipe.mu.Unlock()

	blocked := ids[fit*64]
	bctx, bcancel := context.WithCancel(ctx)
	errs := make(chan error, 1)
	go func() { errs <- tb.Update(bctx, blocked, incRow) }()
	waitUntil(t, "the commit past the bound to wait with its row locked", func() bool { return rowLocked(db, tb, blocked) })
	select {
	case err := <-errs:
		require.FailNow(t, "a commit past the in-flight bound returned", "%v", err)
	default:
	}
	bcancel()
	require.ErrorIs(t, recvWithin(t, errs, "the waiting commit"), context.Canceled)

	fs.openAll()
	for _, p := range ps {
		require.NoError(t, p.Wait(ctx))
	}
	require.NoError(t, tb.Update(ctx, ids[(fit+1)*64], incRow))
	buf := make([]byte, 64)
	require.NoError(t, tb.Get(ctx, blocked, buf))
	require.Equal(t, uint64(fit*64), checkRow(t, buf), "the commit whose context ended was not applied")
	db.pipe.mu.Lock()
	require.Zero(t, db.pipe.flightBytes)
	db.pipe.mu.Unlock()
}

// TestEvictedInFlightLinearizable is a model test of evicted pages re-read while their
// batches are unacknowledged. Workers keep asynchronous increments in flight on rows spread
// over four times the pages a 64 KiB cache holds; readers read rows with Get and in
// transactions. The store holds batches back while nobody waits for one (it lets them
// through when a goroutine is about to wait for an acknowledgement, and otherwise one every
// few reads), and answers reads with the older rows meanwhile. Checked: no reader sees a row
// go backwards (a fetch served the older row), and every row ends at the number of
// increments acknowledged on it (a stale read that validated would lose an update).
func TestEvictedInFlightLinearizable(t *testing.T) {
	workers, readers, opsPerWorker, window := 4, 2, 400, 16
	if testing.Short() {
		workers, readers, opsPerWorker, window = 3, 2, 150, 8
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	for _, c := range []struct {
		name             string
		mode             Durability
		remote, fullPage bool
	}{{"durable", Durable, false, false}, {"writeback", WriteBack, false, false},
		{"remote/durable", Durable, true, false}, {"remote/writeback", WriteBack, true, false},
		{"fullpage/durable", Durable, false, true}} {
		mode := c.mode
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			var under store.Store
			var owner uint64
			if c.remote { // the flight store over a storage node on TCP
				under, owner = newRemoteStore(t), remoteTestOwner
			} else {
				under = newLocalStore(t, "")
			}
			fs := newFlightStore(t, under)
			db, err := Open(ctx, Options{Store: fs, OwnerID: owner, CacheBytes: minCacheBytes, CacheWait: time.Minute,
				Durability: mode, FlushInterval: time.Millisecond, FullPageIO: c.fullPage})
			require.NoError(t, err)
			defer closeFlightDB(t, fs, db)
			const pages, hotPerPage = 44, 2
			tb, ids := flushedPages(t, ctx, db, pages)
			var hot []uint64 // rows, all starting at 0
			for p := range pages {
				for k := range hotPerPage {
					id := ids[p*64+k*7]
					require.NoError(t, tb.Put(ctx, id, u64Row(64, 0)))
					hot = append(hot, id)
				}
			}
			require.NoError(t, db.pipe.flush(ctx))
			var everyRead atomic.Int64
			fs.onRead = func() {
				if everyRead.Add(1)%8 == 0 {
					fs.releaseOne()
				}
			}
			db.testHookWait = func(string) { fs.release() }
			fs.hold()

			acked := make([]atomic.Int64, len(hot))
			var stop atomic.Bool
			var wg sync.WaitGroup
			errs := make(chan error, workers+readers)
			for w := range workers {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(seed, uint64(w)))
					s := db.Session()
					type op struct {
						p *Pending
						i int
					}
					var inflight []op
					settle := func(o op) error {
						if err := o.p.Wait(ctx); err != nil {
							return err
						}
						acked[o.i].Add(1)
						return nil
					}
					for range opsPerWorker {
						i := rng.IntN(len(hot))
						id := hot[i]
						inflight = append(inflight, op{s.Go(ctx, func(tx *Tx) error { return tx.Update(tb, id, incRow) }), i})
						if len(inflight) > window {
							if err := settle(inflight[0]); err != nil {
								errs <- err
								return
							}
							inflight = inflight[1:]
						}
					}
					for _, o := range inflight {
						if err := settle(o); err != nil {
							errs <- err
							return
						}
					}
				})
			}
			var rwg sync.WaitGroup
			for r := range readers {
				rwg.Go(func() {
					rng := rand.New(rand.NewPCG(seed, uint64(100+r)))
					seen := make([]uint64, len(hot))
					buf := make([]byte, 64)
					for !stop.Load() {
						i := rng.IntN(len(hot))
						var v uint64
						if r%2 == 0 {
							if err := tb.Get(ctx, hot[i], buf); err != nil {
								errs <- err
								return
							}
							v = binary.LittleEndian.Uint64(buf)
						} else {
							// A transaction of two rows of two pages: each read is validated.
							j := rng.IntN(len(hot))
							var vj uint64
							err := db.View(ctx, func(tx *Tx) error {
								if err := tx.Get(tb, hot[i], buf); err != nil {
									return err
								}
								v = binary.LittleEndian.Uint64(buf)
								if err := tx.Get(tb, hot[j], buf); err != nil {
									return err
								}
								vj = binary.LittleEndian.Uint64(buf)
								return nil
							})
							if err != nil {
								errs <- err
								return
							}
							if vj < seen[j] {
								errs <- fmt.Errorf("row %d went back from %d to %d", hot[j], seen[j], vj)
								return
							}
							seen[j] = vj
						}
						if v < seen[i] {
							errs <- fmt.Errorf("row %d went back from %d to %d", hot[i], seen[i], v)
							return
						}
						seen[i] = v
					}
				})
			}
			done := make(chan struct{})
			go func() { wg.Wait(); stop.Store(true); rwg.Wait(); close(done) }()
			recvWithin(t, done, "the workers and readers")
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			fs.openAll()
			require.NoError(t, db.pipe.flush(ctx))
			buf := make([]byte, 64)
			var total int64
			for i, id := range hot {
				require.NoError(t, tb.Get(ctx, id, buf))
				require.Equal(t, uint64(acked[i].Load()), checkRow(t, buf), "row %d: increments acknowledged", id)
				total += acked[i].Load()
			}
			require.Equal(t, int64(workers*opsPerWorker), total)
			t.Logf("%d batches held, %d ghosts, %d evictions, %d reads", fs.held.Load(), db.cache.ghostsMade.Load(), db.Stats().Evictions, fs.reads.Load())
			require.NotZero(t, db.cache.ghostsMade.Load(), "frames with rows in flight were evicted")
			require.NoError(t, db.cache.verify())
		})
	}
}

// closeFlightDB lets every batch fs holds through, then closes db, failing the test on
// error: a test's deferred end.
func closeFlightDB(t *testing.T, fs *flightStore, db *DB) {
	t.Helper()
	fs.openAll()
	require.NoError(t, db.Close(context.Background()))
}

// flushedPages creates table "t" of 64-byte rows in db and fills pages pages of it, durable,
// failing the test unless they are more than three times the cache's frames.
func flushedPages(t *testing.T, ctx context.Context, db *DB, pages int) (*Table, []uint64) {
	t.Helper()
	tb := newTable(t, ctx, db, "t", 64)
	require.Less(t, 3*db.cache.framesMax(64), pages)
	ids := insertRows(t, db, tb, 64*pages)
	require.NoError(t, db.pipe.flush(ctx))
	return tb, ids
}
