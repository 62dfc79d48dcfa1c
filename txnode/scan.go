package txnode

import (
	"context"
	"errors"
	"iter"
	"math"
	"sync/atomic"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/logicpage"
	"github.com/weftdb/weft/txnode/store"
)

// Scans walk present rows in id order. Below the first id granted to this node in this run,
// only the store can know which pages hold rows, so the scan asks it for a page directory and
// skips empty ranges without page IO; from there on (ids this node inserts, which may not have
// reached the store yet) it walks every page up to the table's id high-water mark. Pages that
// are not fully cached are fetched whole, scanDirBatch at a time in one request.

const scanDirBatch = 32

// Row is one row of a scan. Data is the scan's own copy of the row: it stays valid until the
// loop asks for the next row, whatever the loop body does meanwhile (Update other rows, run
// another Scan); keep it longer by copying it.
type Row struct {
	ID   uint64
	Data []byte
}

// Scan returns the rows of ids in [lo, hi) in id order, in a read-only pass that is not a
// transaction: each row is read consistently, the scan as a whole is not a snapshot. Use
// Tx.Scan for a serializable scan. An error ends the sequence as its last element.
func (t *Table) Scan(ctx context.Context, lo, hi uint64) iter.Seq2[Row, error] {
	return func(yield func(Row, error) bool) {
		tx, err := t.db.beginTx(ctx, false)
		if err != nil {
			yield(Row{}, err)
			return
		}
		defer tx.release()
		tx.scan(t.t, lo, hi, false, yield)
	}
}

// Scan returns the rows of table with ids in [lo, hi) in id order, as part of the
// transaction: the transaction's own writes are seen, and a concurrent commit that changes,
// inserts or deletes a row of the range makes the transaction fail validation (no phantoms).
// An error ends the sequence as its last element.
func (tx *Tx) Scan(table *Table, lo, hi uint64) iter.Seq2[Row, error] {
	return func(yield func(Row, error) bool) {
		if tx.done {
			yield(Row{}, ErrTxDone)
			return
		}
		tx.scan(table.t, lo, hi, true, yield)
	}
}

func (tx *Tx) scan(t *tableState, lo, hi uint64, record bool, yield func(Row, error) bool) {
	if err := tx.serving(t); err != nil {
		yield(Row{}, err)
		return
	}
	// A range that reaches ids this node may still insert (its grant, or past the high-water
	// mark, where its next grant lands) records the table's insert epoch: any insert there
	// before commit is a phantom. The loads go in the reverse order of an insert's stores
	// (take raises idHigh after grantLo; the commit bumps the epoch later, with its write set
	// locked, before it validates), so an insert whose
	// epoch bump this scan saw has its id below the idHigh it reads, and its row is scanned.
	epoch := t.insertEpoch.Load()
	idHigh := t.idHigh.Load()
	grantLo := t.grantLo.Load()
	if record && hi > min(grantLo, idHigh) {
		tx.insReads = append(tx.insReads, insRec{t: t, epoch: epoch})
	}
	hi = min(hi, idHigh)
	if lo >= hi {
		return
	}
	// The scan's own row buffer: Row.Data stays valid until the next iteration whatever the
	// loop body does with the transaction (an Update uses tx.scratch, a nested Scan its own).
	out := make([]byte, t.rowBytes)
	loPage, hiPage := lo/logicpage.RowsPerPage, (hi+logicpage.RowsPerPage-1)/logicpage.RowsPerPage
	freshPage := grantLo / logicpage.RowsPerPage // pages from here may hold rows the store lacks
	var dir []store.PageInfo
	for page := loPage; page < hiPage; {
		var pages []uint64
		if page < freshPage {
			var next uint64
			var err error
			dir, next, err = tx.db.store.PageDir(tx.ctx, t.id, page, min(hiPage, freshPage), scanDirBatch, dir[:0])
			if err != nil {
				yield(Row{}, err)
				return
			}
			for _, p := range dir {
				pages = append(pages, p.Page)
			}
			page = next
		} else {
			for ; page < hiPage && len(pages) < scanDirBatch; page++ {
				pages = append(pages, page)
			}
		}
		for len(pages) > 0 {
			n, ok := tx.scanPages(t, pages, lo, hi, record, out, yield)
			if !ok {
				return
			}
			pages = pages[n:]
		}
	}
}

// scanPages pins and fetches a group of pages, then yields their rows in [lo, hi). It returns
// how many of the pages it did (a plain scan does fewer when the cache cannot hold them all),
// and false when the scan is over: the loop stopped, or an error was yielded as its last
// element.
func (tx *Tx) scanPages(t *tableState, pages []uint64, lo, hi uint64, record bool, out []byte, yield func(Row, error) bool) (int, bool) {
	frames, err := tx.pinScanPages(t, pages, record)
	if err == nil {
		pages = pages[:len(frames)]
		err = tx.fillScanPages(t, pages, frames)
	}
	for i := 0; err == nil && i < len(pages); i++ {
		var more bool
		if more, err = tx.scanPage(t, pages[i], frames[i], lo, hi, record, out, yield); !more && err == nil {
			return 0, false // the loop stopped
		}
	}
	if err != nil {
		yield(Row{}, err)
		return 0, false
	}
	if !record {
		// A plain scan keeps only the group it is reading pinned.
		tx.unpinAll()
	}
	return len(pages), true
}

// pinScanPages pins the pages and returns their frames. A plain scan stops at the first page
// the cache cannot pin beyond the first and returns fewer frames than pages; a transaction's
// scan must hold every page it reads and fails instead.
func (tx *Tx) pinScanPages(t *tableState, pages []uint64, record bool) ([]*frameMeta, error) {
	frames := make([]*frameMeta, len(pages))
	for i, page := range pages {
		m, err := tx.pinPage(t, page, 0)
		if (err == errCacheBusy || errors.Is(err, errWorkingSet)) && !record && i > 0 {
			tx.busy = busyPage{} // read what is pinned, unpin, go on
			return frames[:i], nil
		}
		if err != nil {
			return nil, err
		}
		frames[i] = m
	}
	return frames, nil
}

// fillScanPages reads the rows the pinned frames lack from the store, in one request.
func (tx *Tx) fillScanPages(t *tableState, pages []uint64, frames []*frameMeta) error {
	var reqs []base.PageWant
	var reqFrames []*frameMeta
	var ghostVer uint64
	for i, m := range frames {
		if v := m.valid.Load(); v != ^uint64(0) {
			reqs = append(reqs, base.PageWant{Table: t.id, Page: pages[i], Want: ^v})
			reqFrames = append(reqFrames, m)
			if gv, gm := tx.db.cache.ghostOf(m); gm&^v != 0 {
				ghostVer = max(ghostVer, gv)
			}
		}
	}
	if len(reqs) == 0 {
		return nil
	}
	if ghostVer != 0 { // rows in flight when a page's frame was evicted (see fetch)
		if err := tx.db.pipe.waitSettled(tx.ctx, ghostVer); err != nil {
			return err
		}
	}
	tx.db.cache.misses.Add(uint64(len(reqs)))
	t.cnt.misses.Add(uint64(len(reqs)))
	return tx.db.store.Read(tx.ctx, reqs, func(i int, data, clear uint64, rows []byte) {
		tx.db.fill(t, reqFrames[i], data, clear, rows)
	})
}

// scanPage yields the present rows of one pinned page with ids in [lo, hi), each as the
// transaction sees it: its own write if it has one, else the cached row (refetched while
// invalid, recorded for validation and, under Durable, waited durable). It returns false when
// the loop stopped or on an error. The slot loop is the scan's hot path: one call per row.
func (tx *Tx) scanPage(t *tableState, page uint64, m *frameMeta, lo, hi uint64, record bool, out []byte, yield func(Row, error) bool) (bool, error) {
	if record {
		tx.pageReads = append(tx.pageReads, pageRec{m: m, ver: m.pageVer.Load()})
	} else if err := t.serving(); err != nil {
		// A plain scan has no commit to check the lease at: it reads the lease clock once
		// per page, so it stops serving within a page of the lease's end.
		return false, err
	}
	r := t.rowBytes
	versions, rows := frameWords(m, r)
	for slot := range logicpage.RowsPerPage {
		id := logicpage.RowID(page, slot)
		if id < lo || id >= hi {
			continue
		}
		if j := tx.findWrite(t.id, id); j >= 0 {
			w := &tx.writes[j]
			if w.off < 0 {
				continue // deleted by this transaction
			}
			copy(out, tx.buf[w.off:int(w.off)+r])
		} else {
			bit := uint64(1) << slot
			present, ver, ok, err := readSlot(tx.ctx, tx.db, m, versions, rows, slot, bit, r, out)
			if err == nil && !ok {
				present, ver, err = tx.refetchSlot(t, page, m, versions, rows, slot, out)
			}
			if err != nil {
				return false, err
			}
			if record {
				tx.reads = append(tx.reads, readRec{m: m, slot: uint8(slot), ver: ver})
			}
			tx.maxRead = max(tx.maxRead, ver)
			if tx.db.opts.Durability == Durable && (ver > tx.db.durableVer.Load() || ver <= tx.db.failHi.Load()) {
				if err := tx.db.waitDurable(tx.ctx, ver); err != nil {
					return false, err
				}
			}
			if !present {
				continue
			}
		}
		if !yield(Row{ID: id, Data: out}, nil) {
			return false, nil
		}
	}
	return true, nil
}

// refetchSlot reads a slot that is invalid (the fill skipped it: a committer held it and then
// rolled back; or a failed batch invalidated it while we read): it fetches the slot and reads
// it again, at most scanRefetchMax times, then fails with ErrConflict.
func (tx *Tx) refetchSlot(t *tableState, page uint64, m *frameMeta, versions []uint64, rows []byte, slot int, out []byte) (present bool, ver uint64, err error) {
	bit := uint64(1) << slot
	for range scanRefetchMax {
		if err := tx.db.fetch(tx.ctx, t, m, page, bit); err != nil {
			return false, 0, err
		}
		present, ver, ok, err := readSlot(tx.ctx, tx.db, m, versions, rows, slot, bit, t.rowBytes, out)
		if err != nil || ok {
			return present, ver, err
		}
	}
	return false, 0, ErrConflict
}

// scanRefetchMax bounds how often a scan fetches a slot that keeps being invalid.
const scanRefetchMax = 8

// readSlot copies a slot consistently, parked (within ctx) while it is locked; ok is false
// when the slot is not valid.
func readSlot(ctx context.Context, db *DB, m *frameMeta, versions []uint64, rows []byte, slot int, bit uint64, r int, out []byte) (present bool, ver uint64, ok bool, err error) {
	for {
		v1 := atomic.LoadUint64(&versions[slot])
		if v1&versionLock != 0 {
			if err := db.cache.rows.wait(ctx, m, slot, &versions[slot]); err != nil {
				return false, 0, false, err
			}
			continue
		}
		if m.valid.Load()&bit == 0 {
			return false, 0, false, nil
		}
		present = m.present.Load()&bit != 0
		if present {
			logicpage.LoadRow(out, rows[slot*r:(slot+1)*r])
		}
		if atomic.LoadUint64(&versions[slot]) == v1 {
			return present, v1, true, nil
		}
	}
}

// ScanAll returns every row of the table in id order: Scan over the whole id space, [0,
// math.MaxUint64), with no bound to pick. Like Scan it is not a snapshot.
func (t *Table) ScanAll(ctx context.Context) iter.Seq2[Row, error] {
	return t.Scan(ctx, 0, math.MaxUint64)
}

// ScanAll returns every row of table in id order as part of the transaction, like Scan over
// [0, math.MaxUint64): a concurrent insert anywhere in the table makes the transaction fail
// validation.
func (tx *Tx) ScanAll(table *Table) iter.Seq2[Row, error] {
	return tx.Scan(table, 0, math.MaxUint64)
}
