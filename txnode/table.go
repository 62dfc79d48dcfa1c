package txnode

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/weftdb/weft/logicpage"
)

// Table is a handle on one table, for single-row operations and scans. Each single-row call is
// a transaction of its own; Get on a cached row takes a lock-free fast path (no syscall, no
// allocation, no lock). Handles are cheap and safe for concurrent use.
type Table struct {
	db *DB
	t  *tableState
}

// Name returns the table's name.
func (t *Table) Name() string { return t.t.name }

// RowBytes returns the table's row size.
func (t *Table) RowBytes() int { return t.t.rowBytes }

// Get copies row id into dst, whose length must be the row size. It returns ErrNotFound when
// the row does not exist. In Durable mode a row written by a commit not yet durable is
// returned only once that commit is durable.
func (t *Table) Get(ctx context.Context, id uint64, dst []byte) error {
	if st := t.t; len(dst) != st.rowBytes {
		return fmt.Errorf("%w: buffer of %d bytes, table %q has %d-byte rows", ErrRowSize, len(dst), st.name, st.rowBytes)
	}
	return t.read(ctx, id, copyRow(dst))
}

// read is Get, View or ViewVersion of row id, as r says: a transaction of its own, lock-free
// on a cache hit.
func (t *Table) read(ctx context.Context, id uint64, r rowRead) error {
	st := t.t
	db := t.db
	if db.closed.Load() {
		return ErrClosed
	}
	if err := st.serving(); err != nil {
		return err
	}
	if id >= st.idHigh.Load() {
		return ErrNotFound // never granted (and its page would not fit a page key)
	}
	page, slot := logicpage.PageOf(id)
	key := pageKey(st.id, page)
	bit := uint64(1) << slot
	for {
		// The page table's slot names the frame's metadata and memory, so the row's loads
		// below need not wait for the metadata's (a miss each, in parallel).
		sl := db.cache.pt.find(key)
		if sl == nil {
			break
		}
		m, mem := sl.meta.Load(), sl.mem.Load()
		if m == nil || mem == nil {
			break
		}
		// The frame's generation, then its key and memory: while the generation stays, the
		// frame holds this page (see frameMeta.state), so mem is its memory, of this table's
		// row size (memory changes only while its frame holds no key).
		state := m.state.Load()
		if m.key.Load() != key || m.mem.Load() != mem || (m.state.Load()^state)&^refBit != 0 {
			break // evicted since the lookup, or the slot was being rewritten
		}
		versions, rows := wordsOf(mem, st.rowBytes)
		v1 := atomic.LoadUint64(&versions[slot])
		if v1&versionLock != 0 {
			// Parked, not spinning: the locker may wait for acknowledgements. The frame is
			// not pinned here: the loop checks its key again after the wait.
			if err := db.cache.rows.wait(ctx, m, slot, &versions[slot]); err != nil {
				return err
			}
			continue
		}
		if m.valid.Load()&bit == 0 {
			break
		}
		present := m.present.Load()&bit != 0
		if db.testHookGet != nil {
			db.testHookGet()
		}
		var ferr error
		if present {
			off := slot * st.rowBytes
			if row := rows[off : off+st.rowBytes : off+st.rowBytes]; r.mode == readCopy {
				logicpage.LoadRow(r.dst, row)
			} else {
				ferr = r.view(row, true, v1) // View, ViewVersion
			}
		}
		if db.testHookGet != nil {
			db.testHookGet()
		}
		if atomic.LoadUint64(&versions[slot]) != v1 || (m.state.Load()^state)&^refBit != 0 {
			continue // changed, or the frame was given another page meanwhile
		}
		if state&refBit == 0 {
			m.state.Or(refBit) // CLOCK's bit; not stored on every hit: cores reading one page share its line
		}
		st.cnt.fastHit()
		if db.opts.Durability == Durable && (v1 > db.durableVer.Load() || v1 <= db.failHi.Load()) {
			if err := db.waitDurable(ctx, v1); err != nil {
				return err
			}
		}
		if !present {
			return ErrNotFound
		}
		return ferr
	}
	return t.getSlow(ctx, id, r)
}

func (t *Table) getSlow(ctx context.Context, id uint64, r rowRead) error {
	tx, err := t.db.beginTx(ctx, false)
	if err != nil {
		return err
	}
	released := false
	defer func() {
		if !released { // a panic in fn: the frame it pinned must not stay pinned
			tx.release()
		}
	}()
	switch r.mode {
	case readViewVersion:
		// A fresh transaction has no writes of its own: the row is read from the cache.
		var ok bool
		if ok, err = tx.readRow(t.t, id, r); err == nil && !ok {
			err = ErrNotFound
		}
	case readView:
		err = tx.View(t, id, r.fn)
	default:
		err = tx.Get(t, id, r.dst)
	}
	// One row, copied consistently: nothing to validate (a commit to the row since would
	// only fail it with ErrConflict). In Durable mode it waits until what it read is durable.
	// An error after the row was read (ErrNotFound, or View's fn's) is, like the fast
	// path's, returned once what was read is durable: an absence too (a deletion not yet
	// durable could come back after a crash).
	recorded := len(tx.reads) > 0
	p := commitWait{ver: tx.maxRead}
	released = true
	tx.release()
	if err != nil && !recorded {
		return err
	}
	if werr := p.wait(t.db, ctx); werr != nil {
		return werr
	}
	return err
}

// Put replaces row id with row. It returns ErrNotFound when the row does not exist.
func (t *Table) Put(ctx context.Context, id uint64, row []byte) error {
	if len(row) != t.t.rowBytes {
		return fmt.Errorf("%w: %d bytes, table %q has %d-byte rows", ErrRowSize, len(row), t.t.name, t.t.rowBytes)
	}
	return t.db.retry(ctx, true, func(tx *Tx) error { return tx.update(t.t, id, rowChange{put: row}) })
}

// Update calls fn with a copy of row id and writes what fn leaves in it. fn may run more than
// once (the transaction is retried on conflict): it must not have other effects. If fn returns
// an error nothing is written and Update returns it.
func (t *Table) Update(ctx context.Context, id uint64, fn func(row []byte) error) error {
	return t.db.retry(ctx, true, func(tx *Tx) error {
		return tx.update(t.t, id, rowChange{update: fn, isUpdate: true})
	})
}

// Delete deletes row id. It returns ErrNotFound when the row does not exist.
func (t *Table) Delete(ctx context.Context, id uint64) error {
	return t.db.Update(ctx, func(tx *Tx) error { return tx.Delete(t, id) })
}

// Insert adds a row under a new id and returns the id. A context done before the row is
// installed returns ctx.Err() with nothing inserted (and id 0); once it is installed the id is
// returned even with an error: ErrUnknownOutcome (the context ended while it was being made
// durable) or the commit batch's failure leave the row possibly durable under that id.
func (t *Table) Insert(ctx context.Context, row []byte) (uint64, error) {
	for attempt := 0; ; attempt++ {
		tx, err := t.db.beginTx(ctx, true)
		if err != nil {
			return 0, err
		}
		id, err := tx.Insert(t, row)
		if err != nil {
			tx.Rollback()
			return 0, err
		}
		p, err := tx.commit()
		tx.release()
		if err != nil {
			if errors.Is(err, ErrConflict) && attempt < t.db.opts.MaxRetries {
				continue
			}
			return 0, err
		}
		return id, p.wait(t.db, ctx)
	}
}

// retry runs body in one transaction (read-write when writable), retrying conflicts. Its
// callers, each a closure of its own: DB.Update and DB.View (the caller's function, handed
// the Tx: exposed), Table.Put and Table.Update (one row's change, the Tx never handed out).
// body does not escape: each caller's closure stays on its stack (Put and Update allocate
// nothing for it).
//
// A panic in body rolls the running transaction back (its pins and buffers released,
// nothing written) and goes on up the caller's goroutine unchanged.
func (db *DB) retry(ctx context.Context, writable bool, body func(tx *Tx) error) error {
	var busySince time.Time
	var running *Tx // the transaction a panic in body would leave behind
	turn := false   // holds the cache turn (retryBusy)
	defer func() {
		if running != nil {
			running.Rollback()
		}
		if turn {
			db.cache.giveTurn()
		}
	}()
	for attempt := 0; ; {
		tx, err := db.beginTx(ctx, writable)
		if err != nil {
			return err
		}
		running = tx
		tx.turn = turn
		err = body(tx)
		running = nil
		if tx.busy.t != nil {
			if err := tx.retryBusy(&busySince, &turn); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			readVer := tx.maxRead
			err = tx.abort(err)
			if err == ErrConflict && attempt < db.opts.MaxRetries {
				attempt++
				db.stats.retries.Add(1)
				continue
			}
			if err != ErrConflict {
				// The closure's own error: it may rest on rows of a commit not yet durable (a
				// balance it found too low). Return it only once what the closure read is
				// durable, as Get does; if that commit's batch failed, what it read never
				// happened: run the closure again (it reads what the store holds).
				if werr := (commitWait{ver: readVer}).wait(db, ctx); werr != nil {
					if db.readFailed(werr) && attempt < db.opts.MaxRetries {
						attempt++
						db.stats.retries.Add(1)
						continue
					}
					return werr
				}
			}
			return err
		}
		readOnly := len(tx.writes) == 0
		err = tx.Commit()
		if (errors.Is(err, ErrConflict) || readOnly && db.readFailed(err)) && attempt < db.opts.MaxRetries {
			// A read-only transaction whose reads came from a failed batch runs again too.
			attempt++
			db.stats.retries.Add(1)
			continue
		}
		return err
	}
}

// readFailed reports whether err, from waiting for the durability of rows a transaction read,
// says that a batch holding them failed (the pipeline's failure, or a failed range's
// ErrConflict: recover.go), not that the wait ended.
func (db *DB) readFailed(err error) bool {
	return err != nil && (err == db.pipe.failure() || errors.Is(err, ErrConflict))
}

// Update runs fn in a read-write transaction and commits it, retrying on conflict up to
// Options.MaxRetries times: fn may run more than once and must not have effects outside the
// transaction. If fn returns an error the transaction is rolled back and Update returns it
// (unless a concurrent commit changed what fn had read: fn's reads are not a snapshot, so it
// may have seen the state before and after that commit, and the error may come from that;
// then fn runs again, as for a conflict). In Durable mode fn's error is returned only once
// what fn read is durable; if a batch it read from failed, fn runs again (if ctx ends first,
// Update returns ctx's error instead). A transaction that needs a page while the cache is full
// and it holds others is retried too, after parking for the cache turn with nothing held,
// for at most Options.CacheWait in all; then Update returns ErrCacheFull. A panic in fn rolls
// the transaction back and goes on up the caller's goroutine. tx is valid only while fn runs:
// kept, it returns ErrTxDone for ever.
func (db *DB) Update(ctx context.Context, fn func(tx *Tx) error) error {
	return db.retry(ctx, true, func(tx *Tx) error { tx.exposed = true; return fn(tx) })
}

// View runs fn in a read-only transaction, retrying on conflict like Update.
func (db *DB) View(ctx context.Context, fn func(tx *Tx) error) error {
	return db.retry(ctx, false, func(tx *Tx) error { tx.exposed = true; return fn(tx) })
}

// Begin starts a transaction to run by hand: Commit or Rollback it. A conflict at Commit is
// returned as ErrConflict, not retried; so is ErrCacheFull, when the transaction needs a page
// while the cache is full and it holds others. An error a call returns may come from reads
// that a concurrent commit has since changed (they are no snapshot): then Commit fails with
// ErrConflict. The Tx must be used by one goroutine; defer tx.Rollback() (a no-op after
// Commit) so that an early return or a panic does not leave its pages pinned.
func (db *DB) Begin(ctx context.Context, writable bool) (*Tx, error) {
	if db.closed.Load() {
		return nil, ErrClosed
	}
	// Not from the pool: the caller keeps the pointer after Commit.
	return &Tx{db: db, ctx: ctx, writable: writable, manual: true}, nil
}
