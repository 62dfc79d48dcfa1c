package txnode

import (
	"time"

	"github.com/weftdb/weft/base"
)

// The commit pipeline in WriteBack: dirty frames noted at install, and the flusher's epochs,
// each a consistent cut of every dirty row into one batch.

// noteDirty records a frame that became dirty (WriteBack).
func (p *pipeline) noteDirty(m *frameMeta) {
	p.dirtyMu.Lock()
	p.dirty = append(p.dirty, m)
	p.dirtyMu.Unlock()
	p.dirtyBytes.Add(frameCost(int(m.rowBytes)))
}

func (p *pipeline) flusher() {
	defer p.bg.Done()
	tick := time.NewTicker(p.db.opts.FlushInterval)
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-tick.C:
		case <-p.flushReq:
		case r := <-p.cutReq:
			r <- p.flushEpoch() // buffered: flush may have given up waiting
			continue
		}
		p.flushEpoch()
	}
}

// flushEpoch takes a consistent cut of every dirty row into one batch and sends it. Epochs
// are cut, numbered and sent one at a time (flushMu): were two cuts in progress at once, the
// older could get the higher seq, so older row images would overwrite newer ones at the
// store, and an empty cut could advance the durable version past an epoch not yet sent.
func (p *pipeline) flushEpoch() (cut uint64) {
	p.flushMu.Lock()
	defer p.flushMu.Unlock()
	p.mu.Lock()
	b := p.newBatchLocked()
	p.mu.Unlock()
	p.wbMu.Lock()
	cut = p.db.commitVer.Load()
	// The batch holds the commits after the last cut: a failure fails those and later ones.
	firstVer := p.cutVer + 1
	p.cutVer = cut
	p.dirtyMu.Lock()
	frames := p.dirty
	p.dirty, p.dirtySpare = p.dirtySpare, nil
	p.dirtyBytes.Store(0)
	p.dirtyMu.Unlock()
	for _, m := range frames {
		// Installs are excluded, so only this cut clears dirty bits (and dropTable). A frame
		// with dirty rows is not evicted; pin it before clearing them and until its rows are
		// copied and marked in flight, so the evictor never takes it in between (its memory
		// is read here; after the copy the batch needs it no more: see cache.go).
		if m.dirty.Load() == 0 {
			continue // listed twice, or its table dropped
		}
		m.pins.Add(1)
		d := m.dirty.Swap(0)
		key := m.key.Load()
		var t *tableState
		if key != 0 && d != 0 {
			p.db.mu.Lock()
			t = p.db.byID[uint32(key>>32)]
			p.db.mu.Unlock()
		}
		if t == nil {
			p.db.cache.unpin(m)
			continue
		}
		present := m.present.Load()
		s := base.Segment{Table: t.id, RowBytes: uint16(t.rowBytes), Page: key & (1<<32 - 1), Data: d & present, Clear: d &^ present}
		b.segOff = append(b.segOff, len(b.buf))
		_, rows := frameWords(m, t.rowBytes)
		b.buf = appendRows(b.buf, rows, t.rowBytes, s.Data)
		b.segs = append(b.segs, s)
		if !hasTable(b.tables, t) {
			b.tables = append(b.tables, t)
		}
		b.frames = append(b.frames, refOf(m))
		p.db.cache.markFlight(m, d, cut)
		p.db.cache.unpin(m)
	}
	clear(frames)
	p.dirtySpare = frames[:0]
	p.dirtyRows.Store(0)
	p.dirtyRowBytes.Store(0)
	p.wbMu.Unlock()
	p.mu.Lock()
	p.room.Broadcast() // commits waiting for the epoch bound
	p.mu.Unlock()

	p.mu.Lock()
	defer p.mu.Unlock()
	if len(b.segs) == 0 {
		if len(p.inflight) == 0 && p.failErr == nil {
			p.db.advanceDurable(cut)
		}
		b.retired, b.returned = true, true
		p.recycleLocked(b)
		return cut
	}
	cost := batchCost(b)
	for (len(p.inflight) >= inflightMax || p.prepHold || p.flightBytes > 0 && p.flightBytes+cost > p.flightMax) && p.failErr == nil {
		p.room.Wait()
	}
	if p.failErr != nil {
		// Rows that will never be durable: invalidate them (read from the store again), as a
		// failed batch's are, or reads would go on returning them. The epoch settles once
		// the batches before it have.
		p.db.cache.invalidateRefs(b.frames, false)
		p.unsentVer = max(p.unsentVer, cut)
		p.settleLocked(0)
		p.room.Broadcast()
		b.retired, b.returned = true, true
		p.recycleLocked(b)
		return cut
	}
	b.firstVer, b.lastVer, b.nTx = firstVer, cut, 1
	p.flightBytes += cost
	p.launchLocked(b)
	return cut
}
