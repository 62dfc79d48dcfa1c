package txnode

import "fmt"

// verify checks the invariants stated at the heads of cache.go and pipeline.go that hold
// between operations: the cache's accounting and page table, the pipeline's seq order. The
// model tests call it after every step in invariant builds (assert.Invariants: -race or the
// weft_invariants tag); production never does. Any goroutine may call it; it takes the
// pipeline's mutex, then the cache's, one at a time.
func (db *DB) verify() error {
	if err := db.pipe.verify(); err != nil {
		return fmt.Errorf("txnode: pipeline: %w", err)
	}
	if err := db.cache.verify(); err != nil {
		return fmt.Errorf("txnode: page cache: %w", err)
	}
	return nil
}

// recountBytesLocked recomputes what the cache should account: the fixed part, the page
// table, the metadata chunks made and every frame that holds memory (zombies not reaped yet
// included). Caller holds c.mu.
func (c *pageCache) recountBytesLocked() int64 {
	n := c.fixedBytes() + c.pt.bytes()
	for id := range c.nFrames {
		if id%metaChunk == 0 {
			n += chunkBytes
		}
		m := c.meta(id)
		if m.mem.Load() != nil {
			n += frameCost(int(m.rowBytes))
		}
	}
	return n
}

// verify checks usedBytes against what the cache holds and the budget, pin and in-flight
// counts, that a frame with a key is published under it and holds memory, that a frame
// without memory is neither keyed nor dirty, and that the free and zombie lists own each frame
// id once, and that no cached page has a ghost left.
func (c *pageCache) verify() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if got := c.recountBytesLocked(); got != c.usedBytes {
		return fmt.Errorf("usedBytes %d, the cache holds %d", c.usedBytes, got)
	}
	if c.usedBytes > c.budgetBytes {
		return fmt.Errorf("usedBytes %d over the budget %d", c.usedBytes, c.budgetBytes)
	}
	for key, g := range c.ghosts {
		// A page's next frame takes its ghost over: a cached page has none left.
		if c.pt.lookup(key) >= 0 {
			return fmt.Errorf("page %#x is cached and has a ghost (version %d)", key, g.ver)
		}
	}
	if c.waitersHeldBytes < 0 || c.waitersHeld < 0 || (c.waitersHeld == 0) != (c.waitersHeldBytes == 0) {
		return fmt.Errorf("waiters hold %d frames of %d bytes", c.waitersHeld, c.waitersHeldBytes)
	}
	if err := c.verifyPinsLocked(); err != nil {
		return err
	}
	listed := make(map[int32]string)
	for _, l := range []struct {
		name string
		ids  []int32
	}{{"free", c.free}, {"zombie", c.zombies}} {
		for _, id := range l.ids {
			if id < 0 || id >= c.nFrames {
				return fmt.Errorf("%s frame id %d of %d", l.name, id, c.nFrames)
			}
			if other, ok := listed[id]; ok {
				return fmt.Errorf("frame %d is %s and %s", id, other, l.name)
			}
			listed[id] = l.name
		}
	}
	a, used := c.pt.cur.Load(), 0
	for i := range a.slots {
		sl := &a.slots[i]
		if sl.key.Load() != 0 {
			used++
		} else if sl.meta.Load() != nil || sl.mem.Load() != nil {
			return fmt.Errorf("empty page-table slot %d keeps a frame reachable", i)
		}
	}
	if used != a.n {
		return fmt.Errorf("page table: %d keys, counted %d", used, a.n)
	}
	for id := range c.nFrames {
		m := c.meta(id)
		key, hasMem := m.key.Load(), m.mem.Load() != nil
		if p := m.pins.Load(); p < 0 {
			return fmt.Errorf("frame %d: %d pins", id, p)
		}
		if m.frameIdx != id {
			return fmt.Errorf("frame %d: its metadata says id %d", id, m.frameIdx)
		}
		if listed[id] == "free" && hasMem {
			return fmt.Errorf("free frame %d holds memory", id)
		}
		if listed[id] == "zombie" && key != 0 {
			return fmt.Errorf("zombie frame %d keyed %#x", id, key)
		}
		if !hasMem && (key != 0 || m.dirty.Load() != 0) {
			return fmt.Errorf("frame %d without memory keyed %#x, dirty %#x", id, key, m.dirty.Load())
		}
		if key != 0 {
			if got := c.pt.lookup(key); got != id {
				return fmt.Errorf("frame %d keyed %#x, the page table says %d", id, key, got)
			}
			if sl := c.pt.find(key); sl.meta.Load() != m || sl.mem.Load() != m.mem.Load() {
				return fmt.Errorf("frame %d keyed %#x: its page-table slot names other metadata or memory", id, key)
			}
		}
	}
	return nil
}

// verify checks the seq order of the batches in flight: increasing seqs below nextSeq,
// increasing version ranges, bounded queues, and that a batch kept for reuse is empty.
func (p *pipeline) verify() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.inflight) > inflightMax || len(p.free) > batchFreeMax {
		return fmt.Errorf("%d batches in flight, %d free", len(p.inflight), len(p.free))
	}
	for i, b := range p.inflight {
		// Increasing, below nextSeq; not consecutive: a two-phase prepare takes a seq of its
		// own (prepare.go) while batches are in flight.
		if b.seq >= p.nextSeq || i > 0 && b.seq <= p.inflight[i-1].seq {
			return fmt.Errorf("batch %d in flight has seq %d (the one before %d, next %d)", i, b.seq, p.inflight[max(i-1, 0)].seq, p.nextSeq)
		}
		if b.retired || b.firstVer > b.lastVer {
			return fmt.Errorf("batch seq %d in flight: retired %v, versions %d..%d", b.seq, b.retired, b.firstVer, b.lastVer)
		}
		if i > 0 && b.firstVer <= p.inflight[i-1].lastVer {
			return fmt.Errorf("batch seq %d versions %d.. not after seq %d's ..%d", b.seq, b.firstVer, p.inflight[i-1].seq, p.inflight[i-1].lastVer)
		}
	}
	if o := p.open; o.nTx > 0 && len(p.inflight) > 0 && p.failErr == nil && o.firstVer <= p.inflight[len(p.inflight)-1].lastVer {
		return fmt.Errorf("open batch versions %d.. not after the last in flight ..%d", o.firstVer, p.inflight[len(p.inflight)-1].lastVer)
	}
	for _, b := range p.free {
		if b.nTx != 0 || len(b.buf) != 0 || len(b.frames) != 0 {
			return fmt.Errorf("free batch holds %d transactions, %d bytes, %d frames", b.nTx, len(b.buf), len(b.frames))
		}
	}
	if p.stopped.Load() != (p.failErr != nil || p.closing) {
		return fmt.Errorf("stopped %v, failed %v, closing %v", p.stopped.Load(), p.failErr != nil, p.closing)
	}
	return nil
}
