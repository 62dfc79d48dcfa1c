package storenode

import (
	"fmt"
	"math"
	"math/bits"
	"time"

	"github.com/weftdb/weft/base"
)

// What a server needs of the engine beside its public API (package storenode/server): the
// event loop's non-blocking read of cached pages, the sizes a reply is bounded by before it
// is built, a table's row size, the engine's clock, health and directory. Each method says
// which goroutine may call it; none retains its arguments.

// PageDirEntriesMax bounds the entries of one page directory answer, the engine's (PageDir)
// and a server's PageDir reply alike.
const PageDirEntriesMax = pageDirEntriesMax

// ReadCached answers a read of wants from the disk page cache alone: for each want it fills
// segs[i] (len(segs) >= len(wants)) and appends the rows to rows, each segment's Rows a
// slice of the returned buffer. Every wanted row present must be in a cached frame. ok is
// false, and nothing is answered, when it cannot (the engine's lock is taken, a row needs the
// disk, an error needs reporting): out is then rows as given (its length; the bytes beyond it
// and segs may have been written) and the caller takes the slow path (ReadRowsAs), which also
// reports errors. It never waits for the engine lock or the disk (it may take identMu and
// leaseMu, leaf locks held only briefly): it is an event loop's way into the engine, and any
// goroutine may call it. It allocates only when rows lacks the capacity
// for the rows.
//
// reader is the reading owner: a read of a table it does not read as holder (holderReads: the
// owner id and the incarnation granted the table) takes the slow path when the page has a
// write that is not durable yet (ReadRowsAs waits for it there).
func (e *Engine) ReadCached(reader uint64, wants []base.PageWant, segs []base.Segment, rows []byte) (out []byte, ok bool) {
	return e.ReadCachedUpTo(reader, wants, segs, rows, math.MaxInt)
}

// ReadCachedUpTo is ReadCached, giving up (ok false, nothing read) when the wanted rows that
// exist are more than maxBytes: an event loop copies no more than that in one read.
func (e *Engine) ReadCachedUpTo(reader uint64, wants []base.PageWant, segs []base.Segment, rows []byte, maxBytes int) (out []byte, ok bool) {
	if !e.mu.TryLock() {
		return rows, false
	}
	defer e.mu.Unlock()
	if e.closed || e.failure() != nil {
		return rows, false
	}
	size, hits := 0, uint64(0)
	durable := e.durableThrough()
	for _, w := range wants {
		t, found := e.tables[w.Table]
		if !found || w.Page >= tablePagesMax {
			return rows, false
		}
		if e.moves != nil && e.moveRefusesRead(t, false) != nil {
			return rows, false // the slow path reports it
		}
		if e.holderReadLocked(t, reader, false, w.Page, w.Want) != nil {
			return rows, false // the slow path reports it
		}
		if id, cached := e.cache.lookup(frameKey(t.id, w.Page)); cached && e.cache.frames[id].lsn > durable && !e.holderReads(t, reader) {
			return rows, false // not durable yet, and reader is not the incarnation that wrote it
		}
		size += bits.OnesCount64(w.Want&t.presentWord(w.Page)) * t.geo.RowBytes()
		if size > maxBytes {
			return rows, false // the slow path builds it, off the loop
		}
	}
	if cap(rows)-len(rows) < size {
		rows = append(make([]byte, 0, len(rows)+size), rows...)
	}
	given := len(rows) // a give-up below returns rows as given: nothing answered
	for i, w := range wants {
		t := e.tables[w.Table]
		present := t.presentWord(w.Page)
		data, clear := w.Want&present, w.Want&^present
		start := len(rows)
		if data != 0 {
			id, cached := e.cache.lookup(frameKey(t.id, w.Page))
			if !cached {
				return rows[:given], false
			}
			f := &e.cache.frames[id]
			if f.loading || f.valid&data != data {
				return rows[:given], false
			}
			f.ref = true
			hits++
			rows = gatherRows(rows, e.cache.rows(id), t.geo, data)
		}
		segs[i] = base.Segment{Table: w.Table, RowBytes: uint16(t.geo.RowBytes()), Page: w.Page, Data: data, Clear: clear}
		segs[i].Rows = rows[start:len(rows):len(rows)]
	}
	e.cache.hits += hits // counted as ReadRows does: pages whose rows came from the cache
	return rows, true
}

// PresentRowsSize reports the bytes of the rows a read of wants would return: the wanted rows
// that exist. It takes the engine's lock: not for an event loop.
func (e *Engine) PresentRowsSize(wants []base.PageWant) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	size := 0
	for _, w := range wants {
		t, err := e.table(w.Table)
		if err != nil {
			return 0, err
		}
		if w.Page >= tablePagesMax {
			return 0, fmt.Errorf("%w: page %d beyond a table's last page %d", ErrMalformed, w.Page, tablePagesMax-1)
		}
		size += bits.OnesCount64(w.Want&t.presentWord(w.Page)) * t.geo.RowBytes()
	}
	return size, nil
}

// TableCount reports the live tables. It takes the engine's lock: not for an event loop.
func (e *Engine) TableCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.tables)
}

// RowBytes reports a live table's row size (ErrTableNotFound when there is none). It takes the
// engine's lock: not for an event loop. Table ids are never reused, so a caller may keep the
// answer for good.
func (e *Engine) RowBytes(tableID uint32) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	t, err := e.table(tableID)
	if err != nil {
		return 0, err
	}
	return t.geo.RowBytes(), nil
}

// OpenFiles reports the data files the engine keeps open: its tables and the dropped ones a
// checkpoint has not removed yet (a server's file-descriptor budget counts them). It takes
// the engine's lock.
func (e *Engine) OpenFiles() int { return e.openFiles() }

// Now reads the engine's clock (Options.Now): the clock its leases are measured on. Any
// goroutine; it takes no lock.
func (e *Engine) Now() time.Time { return e.opts.Now() }

// Failure reports nil while the engine accepts commits, else why it stopped: ErrFailStop
// wrapping the IO failure. Any goroutine; it takes no lock but the failure's own.
func (e *Engine) Failure() error { return e.failure() }

// Dir reports the engine's directory as given in Options.Dir.
func (e *Engine) Dir() string { return e.opts.Dir }

// WaitsForDurability reports whether something waits for an LSN to become durable: a read
// that is not its table's holder's, or a retried batch acknowledged once its first copy is
// synced. Diagnostics and tests (a test that must know a read is parked before it lets the
// fsync go); any goroutine.
func (e *Engine) WaitsForDurability() bool {
	e.ackMu.Lock()
	defer e.ackMu.Unlock()
	return e.durableCh != nil || len(e.dupAcks) > 0
}
