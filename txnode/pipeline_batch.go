package txnode

import (
	"math/bits"
	"slices"
	"sync/atomic"
	"unsafe"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/assert"
	"github.com/weftdb/weft/logicpage"
)

// The commit pipeline's batches: a commit's rows copied into the open batch (appendTx), what
// a batch costs against the in-flight bound, and retired batches kept for reuse.

// newBatchLocked returns an empty batch, a reused one when there is one. Caller holds mu.
func (p *pipeline) newBatchLocked() *batch {
	if n := len(p.free); n > 0 {
		b := p.free[n-1]
		p.free[n-1] = nil
		p.free = p.free[:n-1]
		return b
	}
	b := &batch{}
	b.done = func(lsn uint64, err error) { p.complete(b, lsn, commitError(err)) }
	return b
}

// recycleLocked keeps b for reuse once nothing refers to it any more: it is retired and the
// store is done with it. Caller holds mu.
func (p *pipeline) recycleLocked(b *batch) {
	// - Every batch that leaves the open slot or flight gives back its cost: what is counted
	//   never goes below zero.
	assert.That(p.flightBytes >= 0, "txnode: in-flight bytes below zero")
	if !b.retired || !b.returned {
		return
	}
	if len(p.free) >= batchFreeMax || cap(b.buf) > batchKeepBytes || cap(b.segs) > batchKeepSegs {
		return
	}
	clear(b.segs)
	clear(b.tables)
	clear(b.frames)
	*b = batch{buf: b.buf[:0], segs: b.segs[:0], segOff: b.segOff[:0], tables: b.tables[:0],
		frames: b.frames[:0], commit: base.Batch{Fences: b.commit.Fences[:0]}, done: b.done}
	p.free = append(p.free, b)
	// - The free list is bounded (batchFreeMax).
	assert.That(len(p.free) <= batchFreeMax, "txnode: free commit batches over their bound")
}

// segFlightBytes is what a page segment of a batch in flight costs beside its rows: the
// segment, its offset, its frame reference and, should the frame be evicted, its ghost.
const segFlightBytes = int64(unsafe.Sizeof(base.Segment{})+unsafe.Sizeof(frameRef{})) + 8 + 32

// batchCost is what b counts against the in-flight bound.
func batchCost(b *batch) int64 { return int64(len(b.buf)) + int64(len(b.segs))*segFlightBytes }

// flightBytesLocked recounts flightBytes: the cost of the open batch and of the batches in
// flight. Caller holds mu.
func (p *pipeline) flightBytesLocked() int64 {
	n := batchCost(p.open)
	for _, b := range p.inflight {
		n += batchCost(b)
	}
	return n
}

// txFlightBytes is at least what appendTx adds to a batch's cost for tx (whole pages under
// FullPageIO). tx.writes are sorted.
func txFlightBytes(tx *Tx, fullPages bool) int64 {
	var n int64
	var last *frameMeta
	for i := range tx.writes {
		w := &tx.writes[i]
		if w.m != last {
			n += segFlightBytes
			if fullPages {
				n += int64(logicpage.RowsPerPage * w.t.rowBytes)
			}
			last = w.m
		}
		if w.off >= 0 && !fullPages {
			n += int64(w.t.rowBytes)
		}
	}
	return n
}

// appendTx copies the transaction's writes (sorted by table and id) into b as one segment per
// page, and marks them in flight at ver in their frames. Caller holds mu.
func (p *pipeline) appendTx(b *batch, tx *Tx, ver uint64) {
	if p.db.opts.FullPageIO {
		p.appendTxFullPages(b, tx, ver)
		return
	}
	var lastFrame *frameMeta
	var lastMask uint64
	seg := -1
	for i := range tx.writes {
		w := &tx.writes[i]
		page, slot := logicpage.PageOf(w.id)
		bit := uint64(1) << slot
		if seg < 0 || b.segs[seg].Table != w.t.id || b.segs[seg].Page != page {
			b.segs = append(b.segs, base.Segment{Table: w.t.id, RowBytes: uint16(w.t.rowBytes), Page: page})
			b.segOff = append(b.segOff, len(b.buf))
			seg = len(b.segs) - 1
			if !hasTable(b.tables, w.t) {
				b.tables = append(b.tables, w.t)
			}
		}
		s := &b.segs[seg]
		if w.off >= 0 {
			s.Data |= bit
			b.buf = append(b.buf, tx.buf[w.off:int(w.off)+w.t.rowBytes]...)
		} else {
			s.Clear |= bit
		}
		if w.m != lastFrame {
			if lastFrame != nil {
				p.db.cache.markFlight(lastFrame, lastMask, ver)
			}
			b.frames = append(b.frames, refOf(w.m))
			lastFrame, lastMask = w.m, 0
		}
		lastMask |= bit
	}
	if lastFrame != nil {
		p.db.cache.markFlight(lastFrame, lastMask, ver)
	}
}

// appendTxFullPages is the Options.FullPageIO ablation: every page a transaction writes is
// shipped whole, its other present (cached) rows included, as a page-based store would.
//
// The other rows are copied under their version words, as a reader would: a row locked by
// another committer, or changed during the copy, is left out. Its locker ships it in its own
// segment, and that segment comes after this one, or it is an earlier transaction of this
// batch that has not installed yet, so the frame still holds the image before its write:
// shipping that image would undo the write at the store. An unlocked row's bytes are the
// newest installed image, which is at least as new as any segment already in a batch (a
// commit installs, and unlocks, only after its segment is in).
func (p *pipeline) appendTxFullPages(b *batch, tx *Tx, ver uint64) {
	for i := 0; i < len(tx.writes); {
		w0 := &tx.writes[i]
		page, _ := logicpage.PageOf(w0.id)
		j := i
		var data, clr uint64
		for ; j < len(tx.writes); j++ {
			w := &tx.writes[j]
			pg, slot := logicpage.PageOf(w.id)
			if w.t != w0.t || pg != page {
				break
			}
			if w.off >= 0 {
				data |= 1 << slot
			} else {
				clr |= 1 << slot
			}
		}
		m, r := w0.m, w0.t.rowBytes
		candidates := m.present.Load() & m.valid.Load() &^ (data | clr)
		segOff := len(b.buf)
		versions, rows := frameWords(m, r)
		var others uint64
		k := i
		for mask := data | candidates; mask != 0; mask &= mask - 1 {
			slot := bits.TrailingZeros64(mask)
			bit := uint64(1) << slot
			if data&bit != 0 {
				for tx.writes[k].id != logicpage.RowID(page, slot) {
					k++
				}
				w := &tx.writes[k]
				b.buf = append(b.buf, tx.buf[w.off:int(w.off)+r]...)
				continue
			}
			n := len(b.buf)
			b.buf = slices.Grow(b.buf, r)[:n+r]
			if copyUnlockedRow(m, versions, rows, slot, r, b.buf[n:]) {
				others |= bit
			} else {
				b.buf = b.buf[:n]
			}
		}
		b.segs = append(b.segs, base.Segment{Table: w0.t.id, RowBytes: uint16(r), Page: page, Data: data | others, Clear: clr})
		b.segOff = append(b.segOff, segOff)
		if !hasTable(b.tables, w0.t) {
			b.tables = append(b.tables, w0.t)
		}
		p.db.cache.markFlight(m, data|others|clr, ver)
		b.frames = append(b.frames, refOf(m))
		i = j
	}
}

// copyUnlockedRow copies the present row of slot into dst if it is valid and not locked, and
// stays so for the copy; it reports whether it did.
func copyUnlockedRow(m *frameMeta, versions []uint64, rows []byte, slot, r int, dst []byte) bool {
	bit := uint64(1) << slot
	v1 := atomic.LoadUint64(&versions[slot])
	if v1&versionLock != 0 || m.valid.Load()&m.present.Load()&bit == 0 {
		return false
	}
	logicpage.LoadRow(dst, rows[slot*r:(slot+1)*r])
	return atomic.LoadUint64(&versions[slot]) == v1
}

func hasTable(ts []*tableState, t *tableState) bool {
	for _, x := range ts {
		if x == t {
			return true
		}
	}
	return false
}
