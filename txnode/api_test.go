package txnode

import (
	"bytes"
	"context"
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/storenode"
)

// Regression tests of the API rules a game developer relies on (package doc, "Rules"): what
// a context, a wrong row, a panic, a kept Tx, a scan's Row, the lease clock and FullPageIO do.

// tableValues returns every row of tb by id, read through a plain scan.
func tableValues(t *testing.T, tb *Table) map[uint64]uint64 {
	t.Helper()
	got := map[uint64]uint64{}
	for r, err := range tb.Scan(context.Background(), 0, math.MaxUint64) {
		require.NoError(t, err)
		got[r.ID] = checkRow(t, r.Data)
	}
	return got
}

// TestEndedContextAppliesNothing: a context that is done before a write is installed aborts
// it with ctx.Err(): nothing applied, not ErrUnknownOutcome, and Insert returns no id.
func TestEndedContextAppliesNothing(t *testing.T) {
	ctx := context.Background()
	eachConfig(t, openConfigs(t), Options{}, func(t *testing.T, db *DB) {
		tb, ids := newTableRows(t, ctx, db, "c", 3)
		before := tableValues(t, tb)
		ended, cancel := context.WithCancel(ctx)
		cancel()
		check := func(what string, err error) {
			t.Helper()
			require.ErrorIs(t, err, context.Canceled, what)
			require.NotErrorIs(t, err, ErrUnknownOutcome, what)
		}
		id, err := tb.Insert(ended, u64Row(64, 100))
		check("Insert", err)
		require.Zero(t, id, "an Insert that did not happen has no id")
		check("Put", tb.Put(ended, ids[0], u64Row(64, 101)))
		check("Update", tb.Update(ended, ids[1], func(r []byte) error { fillRow(r, 102); return nil }))
		check("Delete", tb.Delete(ended, ids[2]))
		check("DB.Update", db.Update(ended, func(tx *Tx) error {
			if err := tx.Put(tb, ids[0], u64Row(64, 103)); err != nil {
				return err
			}
			_, err := tx.Insert(tb, u64Row(64, 104))
			return err
		}))
		check("Session.Go", db.Session().Go(ended, func(tx *Tx) error {
			return tx.Put(tb, ids[1], u64Row(64, 105))
		}).Wait(ctx))
		tx, err := db.Begin(ended, true)
		require.NoError(t, err)
		require.NoError(t, tx.Put(tb, ids[2], u64Row(64, 106)))
		check("Tx.Commit", tx.Commit())
		require.NoError(t, db.pipe.flush(ctx))
		require.Equal(t, before, tableValues(t, tb), "nothing may be applied")
	})
}

// sentCommitStore reports every commit batch handed to it on sent (held acknowledgements
// keep the writers waiting for durability).
type sentCommitStore struct {
	*heldCommitStore
	sent chan struct{}
}

func (s *sentCommitStore) Commit(b *base.Batch, done func(uint64, error)) {
	// Before the batch goes on: the acknowledgement (and so the committer's return) comes
	// after the report, so a committer that returned has its report in sent.
	select {
	case s.sent <- struct{}{}:
	default:
	}
	s.heldCommitStore.Commit(b, done)
}

// TestInsertUnknownOutcomeKeepsID: a context that ends once the insert is installed (its batch
// is on its way to the store) gives ErrUnknownOutcome, and Insert still returns the id it used,
// under which the row is found once the batch is acknowledged.
func TestInsertUnknownOutcomeKeepsID(t *testing.T) {
	ctx := context.Background()
	hs := &sentCommitStore{heldCommitStore: &heldCommitStore{Store: newLocalStore(t, ""), released: true},
		sent: make(chan struct{}, 1)}
	db := openDB(t, ctx, Options{Store: hs})
	defer db.Close(ctx)
	defer hs.release() // first: a failed assertion must not leave Close waiting for acks
	tb := newTable(t, ctx, db, "u", 64)
	first := insertRow(t, ctx, tb, u64Row(64, 1))
	hs.mu.Lock()
	hs.released = false
	hs.mu.Unlock()
	select {
	case <-hs.sent: // the first insert's batch
	default:
	}

	type result struct {
		id  uint64
		err error
	}
	ictx, cancel := context.WithCancel(ctx)
	got := make(chan result, 1)
	go func() {
		id, err := tb.Insert(ictx, u64Row(64, 2))
		got <- result{id, err}
	}()
	recvWithin(t, hs.sent, "the insert's batch reaching the store")
	cancel()
	r := recvWithin(t, got, "the insert")
	require.ErrorIs(t, r.err, ErrUnknownOutcome)
	require.ErrorIs(t, r.err, context.Canceled)
	require.Greater(t, r.id, first, "the id the insert used, not 0 (another row's id)")
	hs.release()
	buf := make([]byte, 64)
	require.NoError(t, tb.Get(ctx, r.id, buf))
	require.Equal(t, uint64(2), checkRow(t, buf))
}

// TestRowSizeChecked: every row given to be written whose length is not the row size, nil
// included, is ErrRowSize, and the DB goes on working (with 4 KiB rows a nil insert used to
// panic inside the commit pipeline, holding its lock).
func TestRowSizeChecked(t *testing.T) {
	ctx := context.Background()
	for _, rowBytes := range []int{64, 4096} {
		for _, wb := range []Durability{Durable, WriteBack} {
			t.Run(map[Durability]string{Durable: "durable", WriteBack: "writeback"}[wb]+"/"+map[int]string{64: "64", 4096: "4096"}[rowBytes], func(t *testing.T) {
				db := openEmbedded(t, "", Options{Durability: wb})
				tb := newTable(t, ctx, db, "r", rowBytes)
				id := insertRow(t, ctx, tb, u64Row(rowBytes, 7))
				for _, bad := range [][]byte{nil, {}, make([]byte, rowBytes-8), make([]byte, rowBytes+8)} {
					_, err := tb.Insert(ctx, bad)
					require.ErrorIs(t, err, ErrRowSize, "Insert of %d bytes", len(bad))
					require.ErrorIs(t, tb.Put(ctx, id, bad), ErrRowSize)
					require.ErrorIs(t, db.Update(ctx, func(tx *Tx) error {
						_, err := tx.Insert(tb, bad)
						return err
					}), ErrRowSize)
					require.ErrorIs(t, db.Update(ctx, func(tx *Tx) error { return tx.Put(tb, id, bad) }), ErrRowSize)
					p := db.Session().Go(ctx, func(tx *Tx) error {
						_, err := tx.Insert(tb, bad)
						return err
					})
					require.ErrorIs(t, p.Wait(ctx), ErrRowSize)
				}
				// The DB still works: an insert, and Close, complete.
				done := make(chan error, 1)
				go func() {
					id2, err := tb.Insert(ctx, u64Row(rowBytes, 8))
					if err == nil {
						buf := make([]byte, rowBytes)
						if err = tb.Get(ctx, id2, buf); err == nil && !bytes.Equal(buf, u64Row(rowBytes, 8)) {
							err = errors.New("inserted row reads back wrong")
						}
					}
					if err == nil {
						err = db.Close(ctx)
					}
					done <- err
				}()
				require.NoError(t, recvWithin(t, done, "an insert and Close after bad rows"))
				got := tableValues(t, reopenTable(t, db, tb))
				require.Len(t, got, 2, "only the two good rows exist")
			})
		}
	}
}

// reopenTable reopens db's embedded directory and returns the table named like tb.
func reopenTable(t *testing.T, db *DB, tb *Table) *Table {
	t.Helper()
	db2 := openEmbedded(t, db.opts.Dir, Options{})
	tb2, err := db2.Table(context.Background(), tb.Name())
	require.NoError(t, err)
	return tb2
}

// pinnedFrames counts the cache's frames pinned now.
func pinnedFrames(db *DB) int {
	db.cache.mu.Lock()
	defer db.cache.mu.Unlock()
	n := 0
	for id := range db.cache.nFrames {
		if db.cache.meta(id).pins.Load() > 0 {
			n++
		}
	}
	return n
}

// TestClosurePanicRollsBack: a panic in a user's closure goes on up the caller's goroutine
// with its own value, rolls the transaction back (nothing written, nothing left pinned) and
// leaves the DB usable: in a cache that the panicking transactions had filled, the next
// transactions, Insert and Close complete.
func TestClosurePanicRollsBack(t *testing.T) {
	ctx := context.Background()
	for _, wb := range []Durability{Durable, WriteBack} {
		t.Run(map[Durability]string{Durable: "durable", WriteBack: "writeback"}[wb], func(t *testing.T) {
			// 64 KiB: 13 frames of 64-byte rows. Rows on 40 pages.
			db := openEmbedded(t, "", Options{Durability: wb, CacheBytes: minCacheBytes, CacheWait: 10 * time.Second})
			tb := newTable(t, ctx, db, "p", 64)
			ids := insertRows(t, db, tb, 40*64)
			require.NoError(t, db.pipe.flush(ctx))
			before := tableValues(t, tb)
			buf := make([]byte, 64)
			touch := func(tx *Tx, firstPage int) {
				for p := firstPage; p < firstPage+8; p++ {
					require.NoError(t, tx.Get(tb, ids[p*64], buf))
				}
				require.NoError(t, tx.Put(tb, ids[firstPage*64+1], u64Row(64, 999)))
			}
			for round := range 4 {
				first := round * 8 // other pages each round: leaked pins would fill the cache
				require.PanicsWithValue(t, "closure", func() {
					_ = db.Update(ctx, func(tx *Tx) error {
						touch(tx, first)
						panic("closure")
					})
				})
				require.Zero(t, pinnedFrames(db), "a panicking Update left pages pinned")
			}
			require.PanicsWithValue(t, "update fn", func() {
				_ = tb.Update(ctx, ids[5], func([]byte) error { panic("update fn") })
			})
			require.PanicsWithValue(t, "session", func() {
				db.Session().Go(ctx, func(tx *Tx) error {
					touch(tx, 32)
					panic("session")
				})
			})
			require.PanicsWithValue(t, "scan body", func() {
				_ = db.View(ctx, func(tx *Tx) error {
					for range tx.Scan(tb, 0, math.MaxUint64) {
						panic("scan body")
					}
					return nil
				})
			})
			require.PanicsWithValue(t, "plain scan body", func() {
				for range tb.Scan(ctx, 0, math.MaxUint64) {
					panic("plain scan body")
				}
			})
			require.Zero(t, pinnedFrames(db), "a panic left pages pinned")
			require.NoError(t, db.Update(ctx, func(tx *Tx) error {
				for p := 24; p < 32; p++ {
					if err := tx.Get(tb, ids[p*64], buf); err != nil {
						return err
					}
				}
				return nil
			}))
			done := make(chan error, 1)
			go func() {
				_, err := tb.Insert(ctx, u64Row(64, 12345))
				if err == nil {
					err = db.Close(ctx)
				}
				done <- err
			}()
			require.NoError(t, recvWithin(t, done, "Insert and Close after panics"))
			after := tableValues(t, reopenTable(t, db, tb))
			require.Len(t, after, len(before)+1)
			for id, v := range before {
				require.Equal(t, v, after[id], "row %d changed by a panicking transaction", id)
			}
		})
	}
}

// TestKeptTxIsDone: a *Tx kept after its closure returned (DB.Update, View, Session.Go) or
// after Commit (Begin) fails every call with ErrTxDone, for ever: it never writes into a
// later transaction, which the pool may have given the same memory.
func TestKeptTxIsDone(t *testing.T) {
	ctx := context.Background()
	db := openEmbedded(t, "", Options{})
	tb, ids := newTableRows(t, ctx, db, "k", 4)
	var kept []*Tx
	require.NoError(t, db.Update(ctx, func(tx *Tx) error { kept = append(kept, tx); return tx.Put(tb, ids[0], u64Row(64, 10)) }))
	require.NoError(t, db.View(ctx, func(tx *Tx) error { kept = append(kept, tx); return nil }))
	require.ErrorIs(t, db.Update(ctx, func(tx *Tx) error { kept = append(kept, tx); return ErrNotFound }), ErrNotFound)
	require.NoError(t, db.Session().Go(ctx, func(tx *Tx) error { kept = append(kept, tx); return nil }).Wait(ctx))
	manual := openTx(t, ctx, db, true)
	require.NoError(t, manual.Commit())
	kept = append(kept, manual)

	buf := make([]byte, 64)
	checkDone := func(stale *Tx) {
		t.Helper()
		require.ErrorIs(t, stale.Put(tb, ids[1], u64Row(64, 666)), ErrTxDone)
		require.ErrorIs(t, stale.Update(tb, ids[1], func(r []byte) error { fillRow(r, 667); return nil }), ErrTxDone)
		require.ErrorIs(t, stale.Delete(tb, ids[1]), ErrTxDone)
		_, err := stale.Insert(tb, u64Row(64, 668))
		require.ErrorIs(t, err, ErrTxDone)
		require.ErrorIs(t, stale.Get(tb, ids[1], buf), ErrTxDone)
		for _, err := range stale.Scan(tb, 0, math.MaxUint64) {
			require.ErrorIs(t, err, ErrTxDone)
		}
		require.ErrorIs(t, stale.Commit(), ErrTxDone)
		stale.Rollback()
	}
	for round := range 50 {
		// Inside later transactions, which may run in the kept ones' memory.
		require.NoError(t, db.Update(ctx, func(tx *Tx) error {
			for _, stale := range kept {
				require.NotSame(t, stale, tx, "a kept Tx was handed out again")
				checkDone(stale)
			}
			return tx.Put(tb, ids[2], u64Row(64, uint64(round)))
		}))
		for _, stale := range kept {
			checkDone(stale)
		}
	}
	got := tableValues(t, tb)
	require.Equal(t, uint64(1), got[ids[1]], "a kept Tx wrote")
	require.Equal(t, uint64(49), got[ids[2]])
	require.Len(t, got, 4)
}

// TestScanRowDataStable: a Tx.Scan's Row.Data stays as it was yielded until the next
// iteration while the loop body updates other rows (twice, the second time through the
// transaction's own write) and runs another scan.
func TestScanRowDataStable(t *testing.T) {
	ctx := context.Background()
	db := openEmbedded(t, "", Options{})
	tb, ids := newTableRows(t, ctx, db, "d", 20)
	other := ids[19]
	bump := func(r []byte) error { fillRow(r, checkRow(t, r)+1000); return nil }
	require.NoError(t, db.Update(ctx, func(tx *Tx) error {
		n := 0
		for r, err := range tx.Scan(tb, ids[0], ids[10]) {
			require.NoError(t, err)
			want := u64Row(64, uint64(n))
			require.Equal(t, want, r.Data)
			require.NoError(t, tx.Update(tb, other, bump))
			require.NoError(t, tx.Update(tb, other, bump))
			require.NoError(t, tx.Put(tb, ids[18], u64Row(64, 5000+uint64(n))))
			for range tx.Scan(tb, ids[15], ids[19]) {
			}
			require.Equal(t, want, r.Data, "Row.Data of id %d changed inside the loop", r.ID)
			n++
		}
		require.Equal(t, 10, n)
		return nil
	}))
	for r, err := range tb.Scan(ctx, ids[0], ids[5]) {
		require.NoError(t, err)
		want := append([]byte(nil), r.Data...)
		require.NoError(t, tb.Update(ctx, other, bump))
		for range tb.Scan(ctx, ids[15], ids[19]) {
		}
		require.Equal(t, want, r.Data)
	}
}

// fakeLeaseClock is a lease clock the test moves, forwards and back.
type fakeLeaseClock struct{ n atomic.Int64 }

func (c *fakeLeaseClock) nanos() int64 { return c.n.Load() }

func (c *fakeLeaseClock) set(d time.Duration) { c.n.Store(int64(d)) }

// openHourLeaseDB opens a DB of owner owner over TCP to a storage node whose leases last an
// hour, on the lease clock clock, set to 1000 h; the DB closes when the test ends.
func openHourLeaseDB(t *testing.T, ctx context.Context, owner uint64, clock interface {
	leaseClock
	set(time.Duration)
}) *DB {
	t.Helper()
	addr, _ := startStorageNodeWith(t, storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone, LeaseDuration: time.Hour})
	clock.set(1000 * time.Hour)
	db := openDB(t, ctx, Options{StoreAddr: addr, OwnerID: owner, clock: clock})
	t.Cleanup(func() { db.Close(ctx) })
	return db
}

// TestLeaseClockSteppedBack: the lease runs on the injected (monotonic) clock, and once this
// node saw its lease run out, a clock that goes back does not let it serve again: on 767c454
// the lease was wall-clock UnixNano, so a wall clock stepped back revived an expired lease.
func TestLeaseClockSteppedBack(t *testing.T) {
	ctx := context.Background()
	clock := &fakeLeaseClock{}
	db := openHourLeaseDB(t, ctx, 77, clock)
	tb := newTable(t, ctx, db, "l", 64)
	id := insertRow(t, ctx, tb, u64Row(64, 1))
	buf := make([]byte, 64)
	clock.n.Add(int64(44 * time.Minute)) // within three quarters of the hour
	require.NoError(t, tb.Get(ctx, id, buf))
	clock.n.Add(int64(2 * time.Minute))
	require.ErrorIs(t, tb.Get(ctx, id, buf), ErrLeaseExpired)
	clock.n.Add(-int64(3 * time.Hour)) // stepped back
	require.ErrorIs(t, tb.Get(ctx, id, buf), ErrLeaseExpired)
	require.ErrorIs(t, tb.Put(ctx, id, u64Row(64, 2)), ErrLeaseExpired)
	require.ErrorIs(t, db.View(ctx, func(tx *Tx) error { return tx.Get(tb, id, buf) }), ErrLeaseExpired)

	// The default clock is Go's monotonic one: a reading that carries it.
	mc := monoClock{origin: time.Now()}
	a := mc.nanos()
	require.GreaterOrEqual(t, mc.nanos(), a)
	require.NotEqual(t, mc.origin, mc.origin.Round(0), "the origin carries a monotonic reading")
}

// TestFullPageIOKeepsEarlierWrite: with FullPageIO, a transaction that ships a whole page
// while an earlier transaction of the same batch has written a row of it but not installed
// it yet must not ship that row's older image (which the store would apply after the write).
func TestFullPageIOKeepsEarlierWrite(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	db := openEmbedded(t, dir, Options{FullPageIO: true})
	tb, ids := newTableRows(t, ctx, db, "f", 64)
	x, y := ids[3], ids[4]
	var armed atomic.Bool
	inA, goA := make(chan struct{}), make(chan struct{})
	db.testHookAdded = func(tx *Tx) {
		if len(tx.writes) == 1 && tx.writes[0].id == x && armed.CompareAndSwap(true, false) {
			close(inA) // A's rows are in the batch, X still locked and not installed
			<-goA
		}
	}
	armed.Store(true)
	aDone := make(chan error, 1)
	go func() { aDone <- tb.Put(ctx, x, u64Row(64, 111)) }()
	recvWithin(t, inA, "A between add and install")
	require.NoError(t, tb.Put(ctx, y, u64Row(64, 222))) // B ships the whole page, X included
	close(goA)
	require.NoError(t, recvWithin(t, aDone, "A's commit"))
	require.NoError(t, db.Close(ctx))

	got := tableValues(t, reopenTable(t, db, tb))
	require.Equal(t, uint64(111), got[x], "the store has an older image of X than A wrote")
	require.Equal(t, uint64(222), got[y])
	require.Equal(t, uint64(5), got[ids[5]])
}

// TestFullPageIOConcurrentSamePage: with FullPageIO, goroutines each incrementing their own
// rows of one shared page (every commit ships the whole page, the others' rows included) leave
// every row at its count in the store: no commit ships another's row older than it is.
func TestFullPageIOConcurrentSamePage(t *testing.T) {
	ctx := context.Background()
	workers, incs := 8, 300
	if testing.Short() {
		workers, incs = 4, 100
	}
	db := openEmbedded(t, "", Options{FullPageIO: true})
	tb, ids := newTableRows(t, ctx, db, "fc", 64)
	const rowsEach = 4
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			var err error
			for i := 0; i < incs && err == nil; i++ {
				id := ids[w*rowsEach+i%rowsEach]
				err = tb.Update(ctx, id, func(r []byte) error { fillRow(r, checkRow(t, r)+1); return nil })
			}
			errs <- err
		}()
	}
	for range workers {
		require.NoError(t, recvWithin(t, errs, "a worker"))
	}
	require.NoError(t, db.Close(ctx))
	got := tableValues(t, reopenTable(t, db, tb))
	for w := range workers {
		for r := range rowsEach {
			i := w*rowsEach + r
			require.Equal(t, uint64(i)+uint64(incs/rowsEach), got[ids[i]], "row %d in the store", i)
		}
	}
}
