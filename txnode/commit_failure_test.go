package txnode

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/txnode/store"
)

// Regression tests from the hostile review of issue 9's merge; each failed on the code before
// its fix.

// TestWorkingSetOfMixedRowSizes: a transaction holding three pages of 8-byte rows that needs
// one page of 4096-byte rows, in a cache that holds three of the big pages (so easily three
// small and one big), waits for room while another caller holds the rest pinned. It was
// failed at once with ErrCacheFull ("the working set does not fit"): the working-set check
// counted its held frames as frames of the row size it wanted.
func TestWorkingSetOfMixedRowSizes(t *testing.T) {
	ctx := context.Background()
	big := frameCost(4096)
	budget := 3 * big
	for newPageCache(budget, time.Hour).framesMax(4096) < 3 {
		budget += 64
	}
	db := openConfigs(t)[0].opener(t)(Options{CacheBytes: budget, CacheWait: time.Hour})
	bt := newTable(t, ctx, db, "big", 4096)
	st := newTable(t, ctx, db, "small", 8)
	bigIDs := insertRows(t, db, bt, 3*64)
	smallIDs := insertRows(t, db, st, 3*64)

	// Another caller pins two of the big pages: the room left holds one big frame, not one
	// and three small ones.
	ps, err := db.Pin(ctx, bt, bigIDs[0], bigIDs[2*64-1]+1)
	require.NoError(t, err)
	require.Equal(t, 2, ps.Pages())
	released := false
	defer func() {
		if !released {
			ps.Release()
		}
	}()

	res := make(chan error, 1)
	go func() {
		res <- db.View(ctx, func(tx *Tx) error {
			for i := 0; i < 3; i++ {
				if err := tx.Get(st, smallIDs[i*64], make([]byte, 8)); err != nil {
					return err
				}
			}
			return tx.Get(bt, bigIDs[2*64], make([]byte, 4096))
		})
	}()
	waitUntil(t, "the transaction to wait for a frame (or fail)", func() bool {
		select {
		case err := <-res:
			require.NoError(t, err, "a working set that fits")
			require.FailNow(t, "the transaction did not need to wait: the test's cache is too big")
		default:
		}
		return db.cache.waiters.Load() > 0
	})
	ps.Release()
	released = true
	require.NoError(t, recvWithin(t, res, "the transaction, once room was made"))
}

// acquireSignalStore closes acquired (once armed) when an Acquire returns to its caller.
type acquireSignalStore struct {
	store.Store
	armed    atomic.Bool
	acquired chan struct{}
}

func (s *acquireSignalStore) Acquire(ctx context.Context, table uint32, owner, epoch uint64, flags store.AcquireFlags) (base.Grant, error) {
	g, err := s.Store.Acquire(ctx, table, owner, epoch, flags)
	if s.armed.CompareAndSwap(true, false) {
		close(s.acquired)
	}
	return g, err
}

// TestAdoptHoldsNoLockOverPipeline: opening a table must not hold the DB's table mutex while
// it takes the pipeline's. The locks made a cycle: adopt held db.mu and took the pipeline's mu
// (noteLastSeq); a batch's completion holds the pipeline's mu and takes the cache's (to wake
// cache waiters); an insert creating a frame holds the cache's mu and takes db.mu (freshNow).
// Here the test holds the pipeline's mutex, as a completing batch does, while a table is
// adopted: db.mu must stay free (it was held until the pipeline's mutex was free, so a frame
// creation with fresh slots, under the cache's mutex, waited for it: a deadlock).
func TestAdoptHoldsNoLockOverPipeline(t *testing.T) {
	ctx := context.Background()
	store := &acquireSignalStore{Store: newLocalStore(t, ""), acquired: make(chan struct{})}
	db := openDB(t, ctx, Options{Store: store})
	defer db.Close(ctx)
	db.pipe.mu.Lock()
	locked := true
	defer func() {
		if locked {
			db.pipe.mu.Unlock()
		}
	}()
	store.armed.Store(true)
	created := make(chan error, 1)
	go func() {
		_, err := db.CreateTable(ctx, "t", 64)
		created <- err
	}()
	<-store.acquired // adopt goes on to register the table
	free := make(chan uint64, 1)
	go func() { free <- db.freshNow(pageKey(1, 0)) }() // as a frame creation under the cache's mu
	recvWithin(t, free, "the table mutex while a table is adopted and the pipeline's mutex is held")
	db.pipe.mu.Unlock()
	locked = false
	require.NoError(t, recvWithin(t, created, "CreateTable"))
}

// TestSessionClosureErrorWaitsForReadDurability: DB.Update's rule for a closure's error holds
// for Session.Go too. The closure read a balance written by a commit whose batch then failed
// and returned "insufficient funds"; Pending.Wait returned that at once, although the balance
// it rested on never became durable. Now Wait reports the closure's error only once what it
// read is durable, and the batch's failure when that batch failed.
func TestSessionClosureErrorWaitsForReadDurability(t *testing.T) {
	ctx := context.Background()
	store := &heldFailStore{Store: newLocalStore(t, ""), entered: make(chan struct{}), release: make(chan struct{})}
	db := openDB(t, ctx, Options{Store: store})
	release, closeDB := releaseBeforeClose(ctx, db, store.release)
	defer closeDB()
	acct, id, drained := heldFailDrain(t, ctx, db, store)

	errInsufficient := errors.New("insufficient funds")
	p := db.Session().Go(ctx, func(tx *Tx) error {
		buf := make([]byte, 64)
		if err := tx.Get(acct, id, buf); err != nil {
			return err
		}
		if checkRow(t, buf) < 10 {
			return errInsufficient // it saw 0, not durable yet
		}
		return tx.Put(acct, id, u64Row(64, checkRow(t, buf)-10))
	})
	select {
	case <-p.Done():
		require.FailNow(t, "the pending resolved before what its closure read was durable")
	default:
	}
	c, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, p.Wait(c), context.Canceled, "nothing applied: the context's own error")
	require.NotErrorIs(t, p.Wait(c), ErrUnknownOutcome)
	release()
	require.ErrorIs(t, recvWithin(t, drained, "the drain"), errInjected)
	recvWithin(t, p.Done(), "the pending, once the batch failed")
	err := p.Wait(ctx)
	require.NotErrorIs(t, err, errInsufficient, "the closure's error rested on a commit that failed")
	require.ErrorIs(t, err, errInjected)
}

// TestSessionClosureErrorAfterDurable: a closure's error over durable rows is Wait's at once.
func TestSessionClosureErrorAfterDurable(t *testing.T) {
	eachConfig(t, openConfigs(t)[:2], Options{}, func(t *testing.T, db *DB) {
		ctx := context.Background()
		acct := newTable(t, ctx, db, "acct", 64)
		id := insertRow(t, ctx, acct, u64Row(64, 5))
		require.NoError(t, db.pipe.flush(ctx))
		errLow := errors.New("too low")
		p := db.Session().Go(ctx, func(tx *Tx) error {
			buf := make([]byte, 64)
			if err := tx.Get(acct, id, buf); err != nil {
				return err
			}
			return errLow
		})
		recvWithin(t, p.Done(), "the pending")
		require.ErrorIs(t, p.Wait(ctx), errLow)
	})
}

// TestCloseHonoursContext: Close waits for the batches in flight only as long as its context
// allows. With a batch the store never acknowledges, Close with an ended context waited for
// ever (its flush gave up, its drain of the batches in flight did not). Now it returns the
// context's error, and the commit still waiting for that batch learns its outcome is unknown.
func TestCloseHonoursContext(t *testing.T) {
	ctx := context.Background()
	store := &heldFailStore{Store: newLocalStore(t, ""), entered: make(chan struct{}), release: make(chan struct{})}
	db := openDB(t, ctx, Options{Store: store})
	defer close(store.release) // the held batch fails at the end (Close may have waited for it)
	tb := newTable(t, ctx, db, "t", 64)
	id := insertRow(t, ctx, tb, u64Row(64, 1))

	store.armed.Store(true)
	put := make(chan error, 1)
	go func() { put <- tb.Put(ctx, id, u64Row(64, 2)) }()
	recvWithin(t, store.entered, "the batch")

	c, cancel := context.WithCancel(ctx)
	cancel()
	closed := make(chan error, 1)
	go func() { closed <- db.Close(c) }()
	require.ErrorIs(t, recvWithin(t, closed, "Close with an ended context"), context.Canceled)
	require.ErrorIs(t, recvWithin(t, put, "the commit in the abandoned batch"), ErrUnknownOutcome)
	require.ErrorIs(t, db.Close(ctx), context.Canceled, "Close is idempotent")
}

// TestWriteBackFailureInvalidatesUnflushedRows: after a WriteBack epoch fails, rows installed
// since (dirty, in no epoch yet) will never be durable. The next cut dropped them but left
// their frames valid and clean: reads kept returning a row that never reached the store (and,
// once the frame was evicted, the store's older one). Now the dropped cut invalidates its
// frames: the row is read from the store again.
func TestWriteBackFailureInvalidatesUnflushedRows(t *testing.T) {
	ctx := context.Background()
	store := &heldFailStore{Store: newLocalStore(t, ""), entered: make(chan struct{}), release: make(chan struct{})}
	db := openDB(t, ctx, Options{Store: store, Durability: WriteBack, FlushInterval: time.Hour})
	release, closeDB := releaseBeforeClose(ctx, db, store.release)
	defer closeDB()
	tb := newTable(t, ctx, db, "t", 64)
	ids := insertRows(t, db, tb, 128) // two pages
	require.NoError(t, db.pipe.flush(ctx))
	a, b := ids[0], ids[64]
	require.Equal(t, a/64+1, b/64)
	before := make([]byte, 64)
	require.NoError(t, tb.Get(ctx, b, before))

	store.armed.Store(true)
	require.NoError(t, tb.Put(ctx, a, u64Row(64, 1000)))
	flushed := make(chan error, 1)
	go func() { flushed <- db.pipe.flush(ctx) }()
	recvWithin(t, store.entered, "the epoch")
	require.NoError(t, tb.Put(ctx, b, u64Row(64, 2000))) // dirty, in no epoch yet
	release()
	require.ErrorIs(t, recvWithin(t, flushed, "the failed epoch"), errInjected)
	db.pipe.flushEpoch() // the flusher's next cut (the failure also asks for one)

	got := make([]byte, 64)
	require.NoError(t, tb.Get(ctx, b, got))
	require.NotEqual(t, uint64(2000), checkRow(t, got), "a row that will never be durable")
	require.Equal(t, before, got, "the store's row")
	_, m := db.cache.lookup(pageKey(tb.t.id, b/64))
	if m != nil {
		require.Zero(t, m.dirty.Load())
	}
}

// gatedAllocStore holds the first AllocIDs after arm until release (reporting entered).
type gatedAllocStore struct {
	store.Store
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (s *gatedAllocStore) AllocIDs(ctx context.Context, table uint32, owner, epoch uint64, pages int) (uint64, uint64, error) {
	if s.armed.CompareAndSwap(true, false) {
		close(s.entered)
		<-s.release
	}
	return s.Store.AllocIDs(ctx, table, owner, epoch, pages)
}

// TestInsertWaitForGrantHonoursContext: an insert waiting behind another insert's id grant
// (a store round trip, which may take a reconnect) gives up when its context ends. It waited
// on the allocator's mutex, ignoring its context, for as long as the grant took.
func TestInsertWaitForGrantHonoursContext(t *testing.T) {
	ctx := context.Background()
	store := &gatedAllocStore{Store: newLocalStore(t, ""), entered: make(chan struct{}), release: make(chan struct{})}
	db := openDB(t, ctx, Options{Store: store})
	release, closeDB := releaseBeforeClose(ctx, db, store.release)
	defer closeDB()
	tb := newTable(t, ctx, db, "t", 64)
	store.armed.Store(true)
	first := make(chan error, 1)
	go func() {
		_, err := tb.Insert(ctx, u64Row(64, 1))
		first <- err
	}()
	recvWithin(t, store.entered, "the first insert's grant")
	c, cancel := context.WithCancel(ctx)
	cancel()
	second := make(chan error, 1)
	go func() {
		_, err := tb.Insert(c, u64Row(64, 2))
		second <- err
	}()
	require.ErrorIs(t, recvWithin(t, second, "an insert with an ended context, behind a grant"), context.Canceled)
	release()
	require.NoError(t, recvWithin(t, first, "the first insert"))
}

// TestInsertIfAbsentPairOneCommits: two transactions that both scanned an empty table and
// insert into it, committing at the same time, must not both abort. Each bumped the insert
// epoch before validating, so each saw the other's bump and both failed: under contention,
// "insert if fewer than K" kept aborting every attempt (a livelock). Now a transaction bumps
// the epoch only from the value it recorded: the second one aborts alone.
func TestInsertIfAbsentPairOneCommits(t *testing.T) {
	eachConfig(t, openConfigs(t)[:2], Options{}, func(t *testing.T, db *DB) {
		ctx := context.Background()
		tb := newTable(t, ctx, db, "t", 64)
		begin := func() *Tx {
			tx := openTx(t, ctx, db, true)
			for _, err := range tx.Scan(tb, 0, 1<<40) {
				require.NoError(t, err)
				require.FailNow(t, "the table is empty")
			}
			return tx
		}
		tx1, tx2 := begin(), begin()
		defer tx1.Rollback()
		defer tx2.Rollback()
		_, err := tx1.Insert(tb, u64Row(64, 1))
		require.NoError(t, err)
		_, err = tx2.Insert(tb, u64Row(64, 2))
		require.NoError(t, err)
		var err2 error
		db.testHookBumped = func(tx *Tx) {
			if tx == tx1 {
				err2 = tx2.Commit() // commits, bumps and validates while tx1 is between the two
			}
		}
		err1 := tx1.Commit()
		db.testHookBumped = nil
		require.ErrorIs(t, err2, ErrConflict, "tx2 validated after tx1's bump")
		require.NoError(t, err1, "one of the two must commit")
		n := 0
		for _, err := range tb.Scan(ctx, 0, 1<<40) {
			require.NoError(t, err)
			n++
		}
		require.Equal(t, 1, n)
	})
}

// heldFailAckStore is heldFailStore, and once the held batch entered it acknowledges every
// later batch at once without passing it on (the store would hold them back behind the
// missing seq, blocking the sender).
type heldFailAckStore struct {
	heldFailStore
	held atomic.Bool
	lsn  atomic.Uint64
}

func (s *heldFailAckStore) Commit(b *base.Batch, done func(uint64, error)) {
	if s.held.Load() {
		done(s.lsn.Add(1)+1<<40, nil)
		return
	}
	if s.armed.Load() {
		s.held.Store(true)
	}
	s.heldFailStore.Commit(b, done)
}

// TestFailedPipelineReleasesOpenBatch: when a batch fails, the commits already in the open
// batch (never sent: the pipeline stops) fail too, and their frames leave flight and are
// invalidated, as a failed batch's are. They stayed in flight for ever (never evictable) with
// rows the store will never have.
func TestFailedPipelineReleasesOpenBatch(t *testing.T) {
	ctx := context.Background()
	store := &heldFailAckStore{heldFailStore: heldFailStore{Store: newLocalStore(t, ""), entered: make(chan struct{}), release: make(chan struct{})}}
	db := openDB(t, ctx, Options{Store: store})
	release, closeDB := releaseBeforeClose(ctx, db, store.release)
	defer closeDB()
	tb := newTable(t, ctx, db, "t", 64)
	other := newTable(t, ctx, db, "other", 64)
	ids := insertRows(t, db, tb, inflightMax)
	oid := insertRow(t, ctx, other, u64Row(64, 1))

	store.armed.Store(true)
	errs := make(chan error, inflightMax+1)
	go func() { errs <- tb.Put(ctx, ids[0], u64Row(64, 100)) }() // its batch is held, then fails
	recvWithin(t, store.entered, "the first batch")
	inflight := func() (int, int) {
		db.pipe.mu.Lock()
		defer db.pipe.mu.Unlock()
		return len(db.pipe.inflight), db.pipe.open.nTx
	}
	for i := 1; i < inflightMax; i++ { // acknowledged, but retired only after the first
		go func() { errs <- tb.Put(ctx, ids[i], u64Row(64, 100)) }()
		waitUntil(t, "the batch in flight", func() bool { n, _ := inflight(); return n == i+1 })
	}
	go func() { errs <- other.Put(ctx, oid, u64Row(64, 2)) }() // stays in the open batch
	waitUntil(t, "the open batch", func() bool { _, n := inflight(); return n == 1 })
	release()
	for range inflightMax + 1 {
		require.ErrorIs(t, recvWithin(t, errs, "a commit of the failed pipeline"), errInjected)
	}
	_, m := db.cache.lookup(pageKey(other.t.id, oid/64))
	require.NotNil(t, m)
	require.LessOrEqual(t, db.cache.flight(m).ver.Load(), db.cache.settledVer.Load(), "the open batch's frame left flight (settled)")
	require.Zero(t, m.valid.Load()&(1<<(oid%64)), "its row, never durable, is invalid")
}
