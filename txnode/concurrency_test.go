package txnode

import (
	"context"
	"encoding/binary"
	"errors"
	"math/bits"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/txnode/store"
)

// Regression tests of issue 9 (transaction node correctness), one per defect: each failed on
// the code before its fix (commit 767c454).

// gatedCommitStore holds the first Commit after arm on its caller's goroutine until release
// (the WriteBack flusher, which calls Commit itself, then cannot cut another epoch), and can
// report a small batch limit, so WriteBack commits wait in the pipeline's add for the next
// epoch. Other calls pass through.
type gatedCommitStore struct {
	store.Store
	batchBytesMax int
	armed         atomic.Bool
	entered       chan struct{}
	release       chan struct{}
}

func newGatedCommitStore(s store.Store, batchBytesMax int) *gatedCommitStore {
	return &gatedCommitStore{Store: s, batchBytesMax: batchBytesMax,
		entered: make(chan struct{}), release: make(chan struct{})}
}

func (s *gatedCommitStore) Info() store.Info {
	info := s.Store.Info()
	if s.batchBytesMax > 0 {
		info.MaxBatchBytes = s.batchBytesMax
	}
	return info
}

func (s *gatedCommitStore) Commit(b *base.Batch, done func(uint64, error)) {
	if s.armed.CompareAndSwap(true, false) {
		close(s.entered)
		<-s.release
	}
	s.Store.Commit(b, done)
}

// Item 1: two "insert if the table is empty" transactions on a fresh table, the first of
// which validated and waits in the pipeline's add (the WriteBack epoch bound, the flusher
// held in the store). Before the fix the insert epoch moved only at install, after add, so
// the second validated in the gap and both committed: two rows in a table meant to hold one.
func TestPhantomInsertWhileFirstWaitsInAdd(t *testing.T) {
	ctx := context.Background()
	db, store, x, release, closeDB := gatedWriteBack(t, ctx) // epochs of at most 128 row bytes
	defer closeDB()
	p := newTable(t, ctx, db, "p", 64)

	// Hold the flusher inside the store with one epoch, then dirty 192 row bytes: the next
	// commit waits in add for an epoch that cannot be cut.
	insertRow(t, ctx, x, u64Row(64, 1))
	store.armed.Store(true)
	db.pipe.flushSoon()
	recvWithin(t, store.entered, "the flusher in Commit")
	for i := range 3 {
		insertRow(t, ctx, x, u64Row(64, uint64(10+i)))
	}

	// Both race through DB.Update (a conflict retries): whatever the interleaving, exactly
	// one row may result. The winner waits in add until the flusher is released; a loser
	// that retries meanwhile finds the winner's row locked and waits for it.
	errNotEmpty := errors.New("not empty")
	insertIfEmpty := func() error {
		return db.Update(ctx, func(tx *Tx) error {
			for _, err := range tx.Scan(p, 0, 1<<40) {
				if err != nil {
					return err
				}
				return errNotEmpty
			}
			_, err := tx.Insert(p, u64Row(64, 7))
			return err
		})
	}
	results := make(chan error, 2)
	go func() { results <- insertIfEmpty() }()
	go func() { results <- insertIfEmpty() }()
	// Before the fix both validated in the gap and both wait in add; give them the time
	// to get there (the outcome checked below does not depend on it).
	var errs []error
	select {
	case err := <-results:
		errs = append(errs, err)
	case <-time.After(time.Second):
	}
	release()
	for len(errs) < 2 {
		errs = append(errs, recvWithin(t, results, "the commits"))
	}
	committed := 0
	for _, err := range errs {
		if err == nil {
			committed++
		} else {
			require.ErrorIs(t, err, errNotEmpty)
		}
	}
	require.Equal(t, 1, committed, "exactly one insert-if-empty commits: %v", errs)
	rows := 0
	for _, err := range p.Scan(ctx, 0, 1<<40) {
		require.NoError(t, err)
		rows++
	}
	require.Equal(t, 1, rows)
}

// Item 2: an insert takes id k (and the fresh-slot mask of its page) but its pin creates the
// page's frame only later (it may wait up to CacheWait for room); meanwhile another insert
// takes k+1, commits, and the page's frame is evicted. The late frame must not mark k+1's
// slot valid and absent: before the fix the committed row k+1 then read as not found. The
// interleaving is played step by step: take, a whole insert, eviction, then the pin.
func TestLatePinKeepsCommittedRow(t *testing.T) {
	for _, cfg := range openConfigs(t) {
		if cfg.durability != Durable {
			continue // eviction needs the row acknowledged
		}
		t.Run(cfg.name, func(t *testing.T) {
			ctx := context.Background()
			db := cfg.opener(t)(Options{CacheBytes: minCacheBytes})
			x := newTable(t, ctx, db, "x", 64)
			y := newTable(t, ctx, db, "y", 64)
			first, err := x.Insert(ctx, u64Row(64, 1)) // the grant, and page 0 in the cache
			require.NoError(t, err)

			// A takes the next id; its frame is not made yet.
			idA, fresh, err := x.t.ids.take(ctx, db)
			require.NoError(t, err)
			require.Equal(t, first+1, idA)
			// B inserts the id after it and commits.
			idB := insertRow(t, ctx, x, u64Row(64, 2))
			require.Equal(t, idA+1, idB)
			// The page's frame is evicted: other pages fill the cache.
			ids := insertRows(t, db, y, 64*40)
			for _, err := range y.Scan(ctx, ids[0], ids[len(ids)-1]+1) {
				require.NoError(t, err)
			}
			_, m := db.cache.lookup(pageKey(x.t.id, 0))
			require.Nil(t, m, "x's page evicted")
			// A's pin now makes the frame.
			_, m, err = db.cache.pin(ctx, pageKey(x.t.id, idA/64), 64, fresh, 0)
			require.NoError(t, err)
			db.cache.unpin(m)

			buf := make([]byte, 64)
			require.NoError(t, x.Get(ctx, idB, buf), "B's committed row")
			require.Equal(t, uint64(2), checkRow(t, buf))
		})
	}
}

// recordingStore records, per commit batch, the first word of every row it writes.
type recordingStore struct {
	store.Store
	mu      sync.Mutex
	batches map[uint64]map[uint64]uint64 // seq -> row id -> first word
}

func (s *recordingStore) Commit(b *base.Batch, done func(uint64, error)) {
	rows := make(map[uint64]uint64)
	for _, seg := range b.Segments {
		k := 0
		for mask := seg.Data; mask != 0; mask &= mask - 1 {
			slot := bits.TrailingZeros64(mask)
			rows[seg.Page*64+uint64(slot)] = binary.LittleEndian.Uint64(seg.Rows[k*int(seg.RowBytes):])
			k++
		}
	}
	s.mu.Lock()
	if s.batches == nil {
		s.batches = make(map[uint64]map[uint64]uint64)
	}
	s.batches[b.Seq] = rows
	s.mu.Unlock()
	s.Store.Commit(b, done)
}

// Item 4: WriteBack epochs flushed from several goroutines at once (the flusher, DropTable
// and Close all flush) must reach the store numbered in the order they were cut. Writers put
// increasing values into their rows; in seq order, no row's value may go back. Before the
// fix an older cut could get the higher seq (thousands of regressions a second).
func TestWriteBackEpochsInCutOrder(t *testing.T) {
	ctx := context.Background()
	rec := &recordingStore{Store: newLocalStore(t, "")}
	db := openDB(t, ctx, Options{Store: rec, Durability: WriteBack, FlushInterval: time.Millisecond})
	defer db.Close(ctx)
	tb := newTable(t, ctx, db, "t", 64)
	writers, flushers, run := 8, 12, time.Second
	if testing.Short() {
		writers, flushers, run = 4, 6, 300*time.Millisecond
	}
	ids := insertRows(t, db, tb, writers)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range flushers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := db.pipe.flush(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	var writersWG sync.WaitGroup
	final := make([]uint64, writers)
	end := time.Now().Add(run) // how long to run, not a synchronisation
	for w := range writers {
		writersWG.Go(func() {
			for v := uint64(1000); time.Now().Before(end); v++ {
				if err := tb.Put(ctx, ids[w], u64Row(64, v)); err != nil {
					t.Error(err)
					return
				}
				final[w] = v
			}
		})
	}
	writersWG.Wait()
	close(stop)
	wg.Wait()
	require.NoError(t, db.Close(ctx))

	rec.mu.Lock()
	defer rec.mu.Unlock()
	seqs := make([]uint64, 0, len(rec.batches))
	for seq := range rec.batches {
		seqs = append(seqs, seq)
	}
	slices.Sort(seqs)
	last := make(map[uint64]uint64)
	regressions := 0
	for _, seq := range seqs {
		for id, v := range rec.batches[seq] {
			if v < last[id] {
				regressions++
			}
			last[id] = max(last[id], v)
		}
	}
	require.Zero(t, regressions, "row values going back in seq order, over %d batches", len(seqs))
	for w, id := range ids {
		require.Equal(t, final[w], last[id])
	}
}

// Item 6: DropTable under write load. Commits admitted after DropTable's flush reached the
// store after the drop, were rejected, and the pipeline fail-stopped for every table (20
// runs of 20). Now the dropped table's late commits fail alone with ErrTableNotFound and
// the other tables keep working; DropTable of an unknown name flushes nothing.
func TestDropTableUnderWriteLoad(t *testing.T) {
	workers := 8
	if testing.Short() {
		workers = 4
	}
	for _, cfg := range openConfigs(t) {
		t.Run(cfg.name, func(t *testing.T) {
			ctx := context.Background()
			db := cfg.opener(t)(Options{FlushInterval: time.Hour})
			a := newTable(t, ctx, db, "a", 64)
			b := newTable(t, ctx, db, "b", 64)
			aIDs := insertRows(t, db, a, 64)
			bIDs := insertRows(t, db, b, 64)

			var wg sync.WaitGroup
			stop := make(chan struct{})
			// signal closes ch once n reaches at.
			signal := func(n *atomic.Int64, at int64, ch chan struct{}) {
				if n.Add(1) == at {
					close(ch)
				}
			}
			var aWrites, aGone, bAfter atomic.Int64
			aGoing, aRefused, bGoing := make(chan struct{}), make(chan struct{}), make(chan struct{})
			dropped := make(chan struct{})
			for w := range workers {
				wg.Go(func() { // writes to a: succeed until the drop, then ErrTableNotFound
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						var err error
						if i%2 == 0 {
							err = a.Put(ctx, aIDs[(w*7+i)%len(aIDs)], u64Row(64, uint64(i)))
						} else {
							_, err = a.Insert(ctx, u64Row(64, uint64(i)))
						}
						if err != nil {
							if !errors.Is(err, ErrTableNotFound) {
								t.Errorf("write to the dropped table: %v", err)
								return
							}
							signal(&aGone, int64(workers), aRefused)
							return // refused: this writer is done
						}
						signal(&aWrites, 100, aGoing)
					}
				})
				wg.Go(func() { // writes to b: always succeed
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						if err := b.Put(ctx, bIDs[(w*5+i)%len(bIDs)], u64Row(64, uint64(i))); err != nil {
							t.Errorf("write to another table: %v", err)
							return
						}
						select {
						case <-dropped:
							signal(&bAfter, 100, bGoing)
						default:
						}
					}
				})
			}
			recvWithin(t, aGoing, "writes to a")
			require.NoError(t, db.DropTable(ctx, "a"))
			close(dropped)
			recvWithin(t, aRefused, "writes to a refused")
			recvWithin(t, bGoing, "writes to b after the drop")
			close(stop)
			wg.Wait()
			require.NoError(t, db.pipe.failure(), "the node keeps committing")
			insertRow(t, ctx, b, u64Row(64, 9))
			_, err := db.Table(ctx, "a")
			require.ErrorIs(t, err, ErrTableNotFound)

			// An unknown name: ErrTableNotFound, and no flush of b's unflushed rows.
			before := db.Stats().Batches
			require.ErrorIs(t, db.DropTable(ctx, "nope"), ErrTableNotFound)
			if cfg.durability == WriteBack {
				require.Equal(t, before, db.Stats().Batches)
			}
			require.NoError(t, db.Close(ctx))
		})
	}
}

// waitUntil polls cond, yielding, until it holds; a watchdog fails the test after 30 s. For
// states no channel reports (a goroutine parked inside the node), never for timing.
func waitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			require.FailNow(t, "timed out waiting for "+what)
		}
		runtime.Gosched()
	}
}

// rowLocked reports whether row id of tb is locked in the cache (a committer holds it).
func rowLocked(db *DB, tb *Table, id uint64) bool {
	_, m := db.cache.lookup(pageKey(tb.t.id, id/64))
	if m == nil {
		return false
	}
	mem := m.mem.Load()
	if mem == nil {
		return false
	}
	versions := versionsOf(mem)
	return atomic.LoadUint64(&versions[id%64])&versionLock != 0
}

// holdInsert holds the flusher in store.Commit and dirties enough rows of x that the next
// WriteBack commit waits in add; then it inserts a row of x in a transaction whose Commit
// waits there, holding the row locked. It returns the row's id and the Commit's outcome.
func holdInsert(t *testing.T, db *DB, store *gatedCommitStore, x *Table, ids []uint64) (uint64, chan error) {
	t.Helper()
	ctx := context.Background()
	// Nothing dirty before the held epoch: the inserts before ran the flusher at the epoch
	// bound, so an epoch of theirs could be held with some of their rows still dirty, and the
	// Puts below would wait in add for ever (seen under -race in CI).
	require.NoError(t, db.pipe.flush(ctx))
	store.armed.Store(true)                                // then the next epoch is held:
	require.NoError(t, x.Put(ctx, ids[0], u64Row(64, 99))) // this row's, however it is cut
	db.pipe.flushSoon()
	recvWithin(t, store.entered, "the flusher in Commit")
	for i := range 3 {
		require.NoError(t, x.Put(ctx, ids[i], u64Row(64, uint64(100+i))))
	}
	tx := openTx(t, ctx, db, true)
	id, err := tx.Insert(x, u64Row(64, 4242))
	require.NoError(t, err)
	res := make(chan error, 1)
	go func() { res <- tx.Commit() }()
	waitUntil(t, "the insert to lock its row", func() bool { return rowLocked(db, x, id) })
	return id, res
}

// Item 5: a fill from the remote store runs on the connection's receiver goroutine. Before
// the fix it spun on a row locked by a committer (an insert into an invalid slot of a cached
// page); the locker may wait for acknowledgements only that receiver delivers: commits,
// scans and lease renewals hung for ever. Here the locker waits in add (WriteBack epoch
// bound); while it does, a read of its row must not stop the receiver: another request on
// the connection is answered.
func TestRemoteFillSkipsLockedRow(t *testing.T) {
	ctx := context.Background()
	addr, _ := startStorageNodeWith(t, storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone})
	remote, err := dialStore(ctx, Options{StoreAddr: addr, OwnerID: 1000}.withDefaults())
	require.NoError(t, err)
	store := newGatedCommitStore(&fillSignalStore{Store: remote, entered: make(chan struct{})}, 256)
	db := openDB(t, ctx, Options{Store: store, Durability: WriteBack, FlushInterval: time.Hour, OwnerID: 1000})
	release, closeDB := releaseBeforeClose(ctx, db, store.release)
	defer closeDB()
	x := newTable(t, ctx, db, "x", 64)
	ids := insertRows(t, db, x, 65) // page 0, and id 64 of a two-page grant (pages 1 and 2)
	require.Equal(t, uint64(64), ids[64])
	require.Equal(t, uint64(192), x.t.idHigh.Load())
	// Page 2 cached by a read, so its other slots are invalid (not fresh).
	require.NoError(t, db.View(ctx, func(tx *Tx) error {
		require.ErrorIs(t, tx.Get(x, 128, make([]byte, 64)), ErrNotFound)
		return nil
	}))
	ids = append(ids, insertRows(t, db, x, 64)...) // ids 65..128: the next insert is 129
	require.Equal(t, uint64(128), ids[len(ids)-1])
	id, res := holdInsert(t, db, store, x, ids)
	require.Equal(t, uint64(129), id)

	// A read of the locked, invalid row: the code before the fix fetched it, and its fill
	// spun on the receiver; the fixed one parks until the row is unlocked (a fetch that
	// started before the lock was taken has its fill skip the slot: TestFillSkipsLockedSlot).
	fs := store.Store.(*fillSignalStore)
	fs.armed.Store(true)
	read := make(chan error, 1)
	go func() {
		read <- db.View(ctx, func(tx *Tx) error { return tx.Get(x, id, make([]byte, 64)) })
	}()
	select {
	case <-fs.entered:
	case <-time.After(2 * time.Second): // the fixed node does not fetch a locked row
	}
	// The receiver must still answer other requests.
	callCtx, cancel := context.WithTimeout(ctx, 10*time.Second) // a watchdog: the fixed node answers at once
	defer cancel()
	_, err = db.Tables(callCtx)
	require.NoError(t, err, "a request on the connection while a fill met a locked row")

	release()
	require.NoError(t, recvWithin(t, res, "the insert"))
	require.NoError(t, recvWithin(t, read, "the read"))
}

// Item 5, directly: a fill that meets a locked slot skips it (before the fix it spun until
// the lock was released, on the receiver goroutine) and leaves it invalid.
func TestFillSkipsLockedSlot(t *testing.T) {
	ctx := context.Background()
	db := openConfigs(t)[0].opener(t)(Options{})
	x, ids := newTableRows(t, ctx, db, "x", 2)
	_, m, err := db.cache.pin(ctx, pageKey(x.t.id, 0), 64, 0, 0)
	require.NoError(t, err)
	defer db.cache.unpin(m)
	versions := frameVersions(m)
	m.valid.And(^uint64(3)) // both rows as if evicted
	atomic.StoreUint64(&versions[1], atomic.LoadUint64(&versions[1])|versionLock)
	done := make(chan struct{})
	go func() {
		defer close(done)
		db.fill(x.t, m, 3, 0, append(u64Row(64, 7), u64Row(64, 8)...))
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second): // a watchdog: the fixed fill never waits
		atomic.StoreUint64(&versions[1], atomic.LoadUint64(&versions[1])&^versionLock)
		<-done
		require.FailNow(t, "fill waited for a locked slot")
	}
	require.Equal(t, uint64(1), m.valid.Load()&3, "slot 0 filled, the locked slot 1 skipped")
	atomic.StoreUint64(&versions[1], atomic.LoadUint64(&versions[1])&^versionLock)
	buf := make([]byte, 64)
	require.NoError(t, x.Get(ctx, ids[1], buf)) // fetched again
	require.Equal(t, uint64(1), checkRow(t, buf))
}

// fillSignalStore reports, once armed, that a fill of Read is being called.
type fillSignalStore struct {
	store.Store
	armed   atomic.Bool
	entered chan struct{}
}

func (s *fillSignalStore) Read(ctx context.Context, reqs []base.PageWant, fill func(int, uint64, uint64, []byte)) error {
	if !s.armed.CompareAndSwap(true, false) {
		return s.Store.Read(ctx, reqs, fill)
	}
	return s.Store.Read(ctx, reqs, func(i int, data, clear uint64, rows []byte) {
		close(s.entered)
		fill(i, data, clear, rows)
	})
}

// Item 7, a locked row: a read of a row whose committer waits in add spun in a Gosched loop
// for as long as the writer waited, ignoring its context. It must park and give up when its
// context ends.
func TestLockedRowReadHonoursContext(t *testing.T) {
	ctx := context.Background()
	db, store, x, release, closeDB := gatedWriteBack(t, ctx)
	defer closeDB()
	ids := insertRows(t, db, x, 8)
	id, res := holdInsert(t, db, store, x, ids)

	read := make(chan error, 2)
	go func() {
		c, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		read <- x.Get(c, id, make([]byte, 64)) // the lock-free path
	}()
	go func() {
		c, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		read <- db.View(c, func(tx *Tx) error { return tx.Get(x, id, make([]byte, 64)) })
	}()
	var errs []error
	for range 2 {
		select {
		case err := <-read:
			errs = append(errs, err)
		case <-time.After(10 * time.Second): // a watchdog: the fixed reads end after 50 ms
		}
	}
	release()
	require.NoError(t, recvWithin(t, res, "the insert"))
	require.Len(t, errs, 2, "reads of a locked row returned after their context ended")
	for _, err := range errs {
		require.ErrorIs(t, err, context.DeadlineExceeded)
	}
}

// Item 7, a cache frame: with every frame pinned, a request waited the whole CacheWait
// (here an hour) although its context ended long before.
func TestCacheWaitHonoursContext(t *testing.T) {
	ctx := context.Background()
	db := openConfigs(t)[0].opener(t)(Options{CacheBytes: minCacheBytes, CacheWait: time.Hour})
	x := newTable(t, ctx, db, "x", 64)
	ids := insertRows(t, db, x, 64*40)
	var sets []*PinSet
	defer func() {
		for _, ps := range sets {
			ps.Release()
		}
	}()
	res := make(chan error, 1)
	go func() {
		// Pin pages until the cache is full: the pin that finds no frame ends with its
		// context.
		for page := uint64(0); page < 40; page++ {
			c, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			ps, err := db.Pin(c, x, page*64, page*64+64)
			cancel()
			if err != nil {
				break
			}
			sets = append(sets, ps)
		}
		c, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		res <- x.Get(c, ids[len(ids)-1], make([]byte, 64))
	}()
	require.ErrorIs(t, recvWithin(t, res, "the Get (a CacheWait of an hour)"), context.DeadlineExceeded)
	require.Less(t, len(sets), 40)
}

// Item 7, the remote store's reconnect: while it dials a storage node that is gone, a call
// waited out the whole reconnect (RequestTimeout) past its own deadline.
func TestRemoteReconnectHonoursContext(t *testing.T) {
	ctx := context.Background()
	addr, stop := startStorageNodeWith(t, storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone})
	db := openDB(t, ctx, Options{StoreAddr: addr, OwnerID: 1000, RequestTimeout: 5 * time.Second})
	defer db.Close(ctx)
	newTable(t, ctx, db, "x", 64)
	stop()
	rs := db.store.(*remoteStore)
	waitUntil(t, "the reconnect", func() bool {
		rs.mu.Lock()
		defer rs.mu.Unlock()
		return rs.dialing
	})
	c, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err := db.Tables(c)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// heldFailStore fails the first commit batch after arm: it reports entered, waits for
// release, then calls done with errInjected without passing the batch on.
type heldFailStore struct {
	store.Store
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (s *heldFailStore) Commit(b *base.Batch, done func(uint64, error)) {
	if s.armed.CompareAndSwap(true, false) {
		close(s.entered)
		go func() {
			<-s.release
			done(0, errInjected)
		}()
		return
	}
	s.Store.Commit(b, done)
}

// releaseBeforeClose returns release, which closes gate (a test store's, holding a batch
// until it closes), and closeDB, for the test to defer: it closes gate if release never ran
// (a test that failed midway), else Close would wait for the held batch for ever, then db.
func releaseBeforeClose(ctx context.Context, db *DB, gate chan struct{}) (release, closeDB func()) {
	var once sync.Once
	release = func() { once.Do(func() { close(gate) }) }
	return release, func() {
		release()
		db.Close(ctx)
	}
}

// gatedWriteBack opens a WriteBack DB (a flush period that never comes) on a local store
// behind a gatedCommitStore of 256 bytes (epochs of at most 128 row bytes), with its table
// "x" of 64-byte rows; release and closeDB are releaseBeforeClose's.
func gatedWriteBack(t *testing.T, ctx context.Context) (db *DB, store *gatedCommitStore, x *Table, release, closeDB func()) {
	t.Helper()
	store = newGatedCommitStore(newLocalStore(t, ""), 256)
	db = openDB(t, ctx, Options{Store: store, Durability: WriteBack, FlushInterval: time.Hour})
	release, closeDB = releaseBeforeClose(ctx, db, store.release)
	return db, store, newTable(t, ctx, db, "x", 64), release, closeDB
}

// heldFailDrain creates "acct" in db (whose store is store) with one row of balance 100,
// durable, then arms store and drains the balance (a Put of 0) in a goroutine: once the Put is
// installed (its row unlocked) and its batch held by store, to fail when released, it returns
// the table, the row and the channel of the Put's outcome.
func heldFailDrain(t *testing.T, ctx context.Context, db *DB, store *heldFailStore) (*Table, uint64, chan error) {
	t.Helper()
	acct := newTable(t, ctx, db, "acct", 64)
	id, err := acct.Insert(ctx, u64Row(64, 100)) // durable: 100
	require.NoError(t, err)

	store.armed.Store(true)
	drained := make(chan error, 1)
	go func() { drained <- acct.Put(ctx, id, u64Row(64, 0)) }() // installed, its batch to fail
	recvWithin(t, store.entered, "the batch")
	waitUntil(t, "the drain installed", func() bool { return !rowLocked(db, acct, id) })
	return acct, id, drained
}

// Item 3: a closure's error escaped before what the closure read was durable. A closure read
// a balance written by a commit whose batch then failed, returned "insufficient funds", and
// Update returned that at once, although the balance it rested on never became durable. Now
// Update waits for the durability of what the closure read, and runs it again when the batch
// failed: it then reads the durable balance and succeeds.
func TestClosureErrorWaitsForReadDurability(t *testing.T) {
	ctx := context.Background()
	store := &heldFailStore{Store: newLocalStore(t, ""), entered: make(chan struct{}), release: make(chan struct{})}
	db := openDB(t, ctx, Options{Store: store})
	defer db.Close(ctx)
	acct, id, drained := heldFailDrain(t, ctx, db, store)

	errInsufficient := errors.New("insufficient funds")
	var runs atomic.Int32
	read := make(chan struct{})
	res := make(chan error, 1)
	go func() {
		res <- db.Update(ctx, func(tx *Tx) error {
			buf := make([]byte, 64)
			if err := tx.Get(acct, id, buf); err != nil {
				return err
			}
			if runs.Add(1) == 1 {
				close(read)
			}
			if checkRow(t, buf) < 10 {
				return errInsufficient
			}
			return tx.Put(acct, id, u64Row(64, checkRow(t, buf)-10))
		})
	}()
	<-read // the closure saw the balance of 0, not durable yet
	close(store.release)
	require.ErrorIs(t, recvWithin(t, drained, "the drain"), errInjected)
	err := recvWithin(t, res, "the Update")
	require.NotErrorIs(t, err, errInsufficient, "the closure's error rested on a commit that failed")
	require.ErrorIs(t, err, errInjected, "run again, the closure read 100 and its commit met the failed node")
	require.GreaterOrEqual(t, runs.Load(), int32(2))
}

// Item 7, the pipeline's add: a commit waiting there for the WriteBack epoch bound (or, in
// Durable mode, for room in a full open batch) ignored its context. It must give up when the
// context ends, before it is installed: nothing applied.
func TestAddWaitHonoursContext(t *testing.T) {
	ctx := context.Background()
	db, store, x, release, closeDB := gatedWriteBack(t, ctx)
	defer closeDB()
	ids := insertRows(t, db, x, 4)
	store.armed.Store(true)
	db.pipe.flushSoon()
	recvWithin(t, store.entered, "the flusher in Commit")
	for i := range 3 {
		require.NoError(t, x.Put(ctx, ids[i], u64Row(64, uint64(100+i))))
	}
	res := make(chan error, 1)
	go func() {
		c, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		res <- x.Put(c, ids[3], u64Row(64, 999))
	}()
	var got error
	select {
	case got = <-res:
	case <-time.After(10 * time.Second): // a watchdog: the fixed commit ends after 50 ms
	}
	release()
	require.ErrorIs(t, got, context.DeadlineExceeded)
	buf := make([]byte, 64)
	require.NoError(t, x.Get(ctx, ids[3], buf))
	require.Equal(t, uint64(3), checkRow(t, buf), "nothing applied")
}
