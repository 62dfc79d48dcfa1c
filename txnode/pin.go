package txnode

import (
	"context"
	"errors"
	"fmt"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/logicpage"
)

// PinSet holds pages of a table in the cache until Release: the seed's transaction and
// group-transaction cache policies, beside CLOCK. A game pins the pages of a zone, a guild or
// a match for as long as it is active; transactions on them then never miss. The pinned pages
// count against CacheBytes.
type PinSet struct {
	db     *DB
	frames []*frameMeta
}

// Pin fetches the pages holding ids [lo, hi) of table and pins them. It fails with
// ErrCacheFull when they cannot all be held within the cache budget (after Options.CacheWait).
func (db *DB) Pin(ctx context.Context, table *Table, lo, hi uint64) (*PinSet, error) {
	if db.closed.Load() {
		return nil, ErrClosed
	}
	t := table.t
	if err := t.serving(); err != nil {
		return nil, err
	}
	ps := &PinSet{db: db}
	hi = min(hi, t.idHigh.Load()) // no rows beyond, and no page keys
	for page := lo / logicpage.RowsPerPage; page*logicpage.RowsPerPage < hi; page++ {
		_, m, err := db.cache.pin(ctx, pageKey(t.id, page), t.rowBytes, 0, 0)
		if err != nil {
			ps.Release()
			return nil, fmt.Errorf("txnode: pin %q [%d, %d): %w", t.name, lo, hi, err)
		}
		ps.frames = append(ps.frames, m)
		if err := db.fetch(ctx, t, m, page, ^uint64(0)); err != nil {
			ps.Release()
			return nil, err
		}
	}
	return ps, nil
}

// Pages returns how many pages the set holds.
func (ps *PinSet) Pages() int { return len(ps.frames) }

// Release unpins the pages. It is idempotent.
func (ps *PinSet) Release() {
	for _, m := range ps.frames {
		ps.db.cache.unpin(m)
	}
	ps.frames = nil
}

// Table pins: Table.Pin holds every page of a table (for a cluster-managed table, of its
// partition) in the cache until Table.Unpin, the pages it has now and those it gets later,
// within a pin budget (Options.PinBytes). A game server pins the partitions of the zones it
// serves (the differentiated caches of the federated memory pool): their reads never miss,
// whatever another partition's scan brings in.
//
// A table pin holds one pin (frameMeta.pins) on each of its frames, so CLOCK skips them as it
// skips a running transaction's frames: no table lookup on the eviction path, no list of
// pinned frames to walk. The budget bounds what the pins hold (frameCost per page) to at most
// three quarters of CacheBytes, so the hand meets, on average, at most a few pinned frames
// per frame it evicts, and transactions keep at least a quarter of the cache for their
// working sets. Pins never make the cache exceed CacheBytes: they hold frames the cache made
// within its budget; a page the cache cannot make room for fails the Pin with ErrCacheFull,
// as any read would.
//
// Invariants (under the cache's mu): pageCache.tp.bytes is frameCost of every frame of every
// table pin's frames, and at most tp.budget; each such frame holds exactly one pin of its
// table pin and holds its table's page (a pinned frame is never evicted; dropTable releases
// the table's pin before it unpublishes the frames).

// tablePin is one pinned table's hold on its frames.
type tablePin struct {
	table    uint32
	rowBytes int
	layout   base.ClusterLayout // Partitions 0: a local table, every page is its
	// frames are the frames it holds a pin on, by page key.
	frames map[uint64]*frameMeta
	// overflow counts the pages made for the table while pinned that the budget left
	// unpinned (evictable as any other).
	overflow uint64
	// ready is closed when the Pin that made it returns; err is its error (nil: pinned).
	ready chan struct{}
	err   error
}

// tablePins are the cache's table pins, under the cache's mu.
type tablePins struct {
	budget  int64 // Options.PinBytes (<= 0: no table may be pinned)
	bytes   int64 // frameCost of every frame the pins hold
	byTable map[uint32]*tablePin
}

// holds reports whether page is one of the table's (its partition's, for a cluster table).
func (p *tablePin) holds(page uint64) bool {
	l := p.layout
	return l.Partitions == 0 || uint32(page/uint64(l.StripePages)%uint64(l.Partitions)) == l.Partition
}

// pagesBelow calls fn for each of the table's pages that hold ids below hi, in order, until
// fn returns false.
func (p *tablePin) pagesBelow(hi uint64, fn func(page uint64) bool) {
	end := (hi + logicpage.RowsPerPage - 1) / logicpage.RowsPerPage
	l := p.layout
	if l.Partitions == 0 {
		for page := uint64(0); page < end; page++ {
			if !fn(page) {
				return
			}
		}
		return
	}
	stripe, round := uint64(l.StripePages), uint64(l.StripePages)*uint64(l.Partitions)
	for base := uint64(l.Partition) * stripe; base < end; base += round {
		for page := base; page < min(base+stripe, end); page++ {
			if !fn(page) {
				return
			}
		}
	}
}

// stickLocked makes the table pin hold frame m of key (the caller holds a pin on m, or mu
// since m's creation): false when the budget has no room for it. Idempotent. Caller holds mu.
func (c *pageCache) stickLocked(p *tablePin, key uint64, m *frameMeta) bool {
	if _, ok := p.frames[key]; ok {
		return true
	}
	cost := frameCost(p.rowBytes)
	if c.tp.bytes+cost > c.tp.budget {
		return false
	}
	m.pins.Add(1)
	p.frames[key] = m
	c.tp.bytes += cost
	return true
}

// stickNewLocked is pin's hook for a frame it just made for key (pinned by the caller): a
// pinned table's page is held by its pin, or counted as an overflow when the budget is
// full. Caller holds mu.
func (c *pageCache) stickNewLocked(key uint64, m *frameMeta) {
	p := c.tp.byTable[uint32(key>>32)]
	if p == nil || !p.holds(key&(1<<32-1)) {
		return
	}
	if !c.stickLocked(p, key, m) {
		p.overflow++
	}
}

// unstickLocked removes table pin p and returns its frames, whose pins the caller releases
// (c.unpin, without mu; or m.pins.Add(-1) under mu). Caller holds mu.
func (c *pageCache) unstickLocked(p *tablePin) map[uint64]*frameMeta {
	if c.tp.byTable[p.table] == p {
		delete(c.tp.byTable, p.table)
	}
	frames := p.frames
	c.tp.bytes -= int64(len(frames)) * frameCost(p.rowBytes)
	p.frames = nil
	return frames
}

// unpinTableLocked releases the pin of a table being dropped (dropTable, before it
// unpublishes the table's frames). Caller holds mu.
func (c *pageCache) unpinTableLocked(table uint32) {
	p := c.tp.byTable[table]
	if p == nil {
		return
	}
	for _, m := range c.unstickLocked(p) {
		m.pins.Add(-1)
	}
	c.roomMade.Broadcast()
}

// Pin holds every page of the table (for a cluster-managed table, of its partition) in the
// cache until Unpin: the pages holding ids below the table's high-water mark now, fetched
// whole before Pin returns, and each page the cache makes for the table while it is pinned.
// Their reads then never miss, whatever else the cache holds. What the pin holds counts
// against Options.PinBytes (frameCost per page: about 64 rows and 64 version words): a table
// whose pages would take the pin budget past it fails with ErrPinBudget, nothing pinned; a
// page the table gains later beyond it stays evictable (TableStats.PinOverflow counts
// them). A page the cache cannot make room for within Options.CacheWait fails the Pin with
// ErrCacheFull, nothing pinned. Pinning a pinned table is a no-op (a Pin in flight is waited
// for, within ctx; if it fails, this one tries itself); a table pin is not counted: one Unpin releases it. DropTable releases
// it. Any goroutine may call it.
func (t *Table) Pin(ctx context.Context) error {
	db, st := t.db, t.t
	if db.closed.Load() {
		return ErrClosed
	}
	if err := st.serving(); err != nil {
		return err
	}
	c := db.cache
	c.mu.Lock()
	for p := c.tp.byTable[st.id]; p != nil; p = c.tp.byTable[st.id] {
		c.mu.Unlock()
		select {
		case <-p.ready:
		case <-ctx.Done():
			return ctx.Err()
		}
		if p.err == nil {
			return nil
		}
		// That Pin failed (its context, the budget, an Unpin: its error is its caller's),
		// and took itself out before it said so: this one tries on its own.
		if err := st.serving(); err != nil {
			return err
		}
		c.mu.Lock()
	}
	p := &tablePin{table: st.id, rowBytes: st.rowBytes, layout: st.layout,
		frames: make(map[uint64]*frameMeta), ready: make(chan struct{})}
	hi := st.idHigh.Load()
	var pages int64
	p.pagesBelow(hi, func(uint64) bool {
		pages++
		return c.tp.bytes+pages*frameCost(st.rowBytes) <= c.tp.budget
	})
	if need := pages * frameCost(st.rowBytes); c.tp.bytes+need > c.tp.budget {
		c.mu.Unlock()
		return fmt.Errorf("%w: table %q: %d+ pages (%d+ bytes of frames) with %d bytes pinned already, of Options.PinBytes %d",
			ErrPinBudget, st.name, pages, need, c.tp.bytes, c.tp.budget)
	}
	if st.dropped.Load() {
		// DropTable set it before its dropTable, which takes mu: one that has not run yet
		// releases p; one that has would not.
		c.mu.Unlock()
		return st.serving()
	}
	if c.tp.byTable == nil {
		c.tp.byTable = make(map[uint32]*tablePin)
	}
	c.tp.byTable[st.id] = p
	c.mu.Unlock()
	err := t.pinPages(ctx, p, hi)
	if err == nil {
		// An Unpin or a DropTable while the last page was fetched ended p (and released
		// what it held): the Pin fails, as one that saw it between pages does.
		c.mu.Lock()
		err = c.pinEndedLocked(st, p)
		c.mu.Unlock()
	}
	if err != nil {
		c.mu.Lock()
		frames := c.unstickLocked(p)
		c.mu.Unlock()
		for _, m := range frames {
			c.unpin(m)
		}
		err = fmt.Errorf("txnode: pin %q: %w", st.name, err)
	}
	p.err = err
	close(p.ready)
	return err
}

// pinPages makes table pin p hold the table's pages below hi, each fetched whole.
func (t *Table) pinPages(ctx context.Context, p *tablePin, hi uint64) error {
	db, st, c := t.db, t.t, t.db.cache
	var err error
	p.pagesBelow(hi, func(page uint64) bool {
		key := pageKey(st.id, page)
		var m *frameMeta
		if _, m, err = c.pin(ctx, key, st.rowBytes, 0, 0); err != nil {
			return false
		}
		c.mu.Lock()
		err = c.pinEndedLocked(st, p)
		switch {
		case err != nil:
		case !c.stickLocked(p, key, m):
			err = fmt.Errorf("%w: page %d: other pins took the budget meanwhile (%d of %d bytes)", ErrPinBudget, page, c.tp.bytes, c.tp.budget)
		}
		c.mu.Unlock()
		if err == nil {
			err = db.fetch(ctx, st, m, page, ^uint64(0))
		}
		c.unpin(m)
		return err == nil
	})
	return err
}

// errUnpinned fails a Pin whose table was unpinned while it pinned its pages.
var errUnpinned = errors.New("txnode: the table was unpinned while being pinned")

// pinEndedLocked reports whether table pin p of st was ended by an Unpin (errUnpinned) or a
// DropTable (ErrTableNotFound) since it was made. Caller holds mu.
func (c *pageCache) pinEndedLocked(st *tableState, p *tablePin) error {
	if c.tp.byTable[st.id] == p {
		return nil
	}
	if st.forgotten.Load() {
		return st.forgottenErr()
	}
	if st.dropped.Load() {
		return fmt.Errorf("%w: %q was dropped", ErrTableNotFound, st.name)
	}
	return errUnpinned
}

// Unpin releases the table's pin (Pin): its pages become evictable again. A no-op on a table
// not pinned; a Pin in flight fails. Any goroutine may call it.
func (t *Table) Unpin() {
	c := t.db.cache
	c.mu.Lock()
	p := c.tp.byTable[t.t.id]
	if t.t.dropped.Load() {
		p = nil // its pin went with it; one under its id now is a forgotten table's next state's (forget.go)
	}
	var frames map[uint64]*frameMeta
	if p != nil {
		frames = c.unstickLocked(p)
	}
	c.mu.Unlock()
	for _, m := range frames {
		c.unpin(m)
	}
}

// checkPinBytes validates Options.PinBytes (after withDefaults).
func (o Options) checkPinBytes() error {
	if o.PinBytes > o.CacheBytes*3/4 {
		return fmt.Errorf("txnode: Options.PinBytes %d is over three quarters of CacheBytes %d: transactions need the rest", o.PinBytes, o.CacheBytes)
	}
	return nil
}

// verifyPinsLocked checks the table pins' invariants (see above): the bytes they hold
// counted and within the budget, each frame of a pin holding its table's page, published,
// with the pin's pin on it. Caller holds mu.
func (c *pageCache) verifyPinsLocked() error {
	var bytes int64
	for table, p := range c.tp.byTable {
		if p.table != table {
			return fmt.Errorf("table pin of %d filed under %d", p.table, table)
		}
		for key, m := range p.frames {
			switch {
			case uint32(key>>32) != table || !p.holds(key&(1<<32-1)):
				return fmt.Errorf("table pin of %d holds page %#x", table, key)
			case m.key.Load() != key:
				return fmt.Errorf("table pin of %d: the frame of page %#x holds %#x", table, key, m.key.Load())
			case m.pins.Load() < 1:
				return fmt.Errorf("table pin of %d: the frame of page %#x has %d pins", table, key, m.pins.Load())
			case c.pt.lookup(key) != m.frameIdx:
				return fmt.Errorf("table pin of %d: the frame of page %#x is not published", table, key)
			}
		}
		bytes += int64(len(p.frames)) * frameCost(p.rowBytes)
	}
	if bytes != c.tp.bytes || c.tp.bytes > max(c.tp.budget, 0) {
		return fmt.Errorf("table pins hold %d bytes, counted %d, budget %d", bytes, c.tp.bytes, c.tp.budget)
	}
	return nil
}
