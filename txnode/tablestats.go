package txnode

import "sync/atomic"

// Per-table cache counters. A table's hits are counted in the cell of the current P
// (procPin, as the DB's were before they moved here): a hit increments a cache line only its
// own core writes, one increment per hit, none of it shared with another table. A partition
// of a cluster table is a table of its own here, so these are the partition's (cluster/node's
// Table.Stats).

// hitCell is one P's cell of a table's hit counters: lock-free hits (Get and View's fast
// path) and transactions' reads served from the cache.
type hitCell struct {
	fast, tx atomic.Uint64
	_        [48]byte
}

// tableCounters are a table's cache counters.
type tableCounters struct {
	cells  [hitShards]hitCell
	misses atomic.Uint64 // fetches from the store for the table (fetch, scans)
}

// fastHit counts a hit of the lock-free path.
func (c *tableCounters) fastHit() {
	c.cells[procPin()%hitShards].fast.Add(1)
	procUnpin()
}

// txHit counts a transaction's row read served from the cache.
func (c *tableCounters) txHit() {
	c.cells[procPin()%hitShards].tx.Add(1)
	procUnpin()
}

// fastHits sums the lock-free hits.
func (c *tableCounters) fastHits() uint64 {
	var n uint64
	for i := range c.cells {
		n += c.cells[i].fast.Load()
	}
	return n
}

// txHits sums the transactions' hits.
func (c *tableCounters) txHits() uint64 {
	var n uint64
	for i := range c.cells {
		n += c.cells[i].tx.Load()
	}
	return n
}

// TableStats are a table's cache counters since it was opened in this DB, and its pin.
type TableStats struct {
	// Hits counts the single-row reads served from the cache without a fetch: Get and
	// View's lock-free path and the reads of transactions (Tx.Get, Tx.View, Update's read).
	// Misses counts the fetches from the store for the table, as Stats.PageMisses does: one
	// per single-row read that missed, one per page a scan or a Pin fetched.
	Hits, Misses uint64
	// Pinned says the table is pinned (Table.Pin); PinnedPages and PinnedBytes are what its
	// pin holds (frameCost per page); PinOverflow counts the pages the table gained while
	// pinned that the pin budget left evictable.
	Pinned      bool
	PinnedPages int
	PinnedBytes int64
	PinOverflow uint64
}

// HitRate is Hits / (Hits + Misses), 0 before any read.
func (s TableStats) HitRate() float64 {
	if s.Hits+s.Misses == 0 {
		return 0
	}
	return float64(s.Hits) / float64(s.Hits+s.Misses)
}

// Stats returns the table's counters. Any goroutine may call it; it takes the cache's mutex
// briefly (not for a hot path).
func (t *Table) Stats() TableStats {
	st := t.t
	s := TableStats{Hits: st.cnt.fastHits() + st.cnt.txHits(), Misses: st.cnt.misses.Load()}
	c := t.db.cache
	c.mu.Lock()
	if p := c.tp.byTable[st.id]; p != nil && !st.dropped.Load() {
		s.Pinned = true
		s.PinnedPages = len(p.frames)
		s.PinnedBytes = int64(len(p.frames)) * frameCost(p.rowBytes)
		s.PinOverflow = p.overflow
	}
	c.mu.Unlock()
	return s
}

// pinnedBytes reports what the table pins hold.
func (c *pageCache) pinnedBytes() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tp.bytes
}
