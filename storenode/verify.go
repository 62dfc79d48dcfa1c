package storenode

import (
	"fmt"
	"maps"

	"github.com/weftdb/weft/base"
)

// verify checks the invariants stated at the heads of pagecache.go, dedup.go and engine.go
// (the table's used tree) by walking every frame, page-map entry and owner: O(cache + maps).
// The model tests call it after every step in invariant builds (assert.Invariants: -race or
// the weft_invariants tag); production never does. It waits for a running checkpoint (ckptMu)
// so the disk-page accounting is between checkpoints, then takes mu; any goroutine may call it.
func (e *Engine) verify() error {
	e.ckptMu.Lock()
	defer e.ckptMu.Unlock()
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.cache.verify(); err != nil {
		return fmt.Errorf("storenode: page cache: %w", err)
	}
	for id, f := range e.cache.frames {
		if f.key == 0 {
			continue
		}
		tid, page := uint32(f.key>>32), f.key&(1<<32-1)
		t, ok := e.tables[tid]
		if !ok || t.dropped {
			return fmt.Errorf("storenode: frame %d caches page %d of table %d, which is not live", id, page, tid)
		}
		if page >= tablePagesMax {
			return fmt.Errorf("storenode: frame %d caches page %d >= tablePagesMax", id, page)
		}
	}
	for id, t := range e.tables {
		if t.id != id {
			return fmt.Errorf("storenode: table %d filed under id %d", t.id, id)
		}
		if t.dropped {
			continue
		}
		if e.byName[t.name] != t {
			return fmt.Errorf("storenode: table %d (%q) missing from the name index", id, t.name)
		}
		if err := verifyDiskPages(t, e.heldPages); err != nil {
			return fmt.Errorf("storenode: table %d: %w", id, err)
		}
		if err := e.verifyLease(t); err != nil {
			return fmt.Errorf("storenode: table %d: %w", id, err)
		}
	}
	if err := e.verifyTxns(); err != nil {
		return err
	}
	e.identMu.Lock()
	defer e.identMu.Unlock()
	for owner, id := range e.idents {
		if owner == 0 || id == nil {
			return fmt.Errorf("storenode: identity of owner %d is %v", owner, id)
		}
		if id.conn != 0 && id.evict == nil {
			return fmt.Errorf("storenode: owner %d is held by connection %d that cannot be evicted", owner, id.conn)
		}
	}
	for owner, o := range e.owners {
		if err := o.verify(); err != nil {
			return fmt.Errorf("storenode: owner %d: %w", owner, err)
		}
	}
	return nil
}

// verifyLease checks a table's ownership state (grants.go): a table has a holder exactly
// when it was granted (epoch > 0), and no lease runs longer than one LeaseDuration from now
// (every grant and renewal sets it to now plus the duration; the clock does not go back).
func (e *Engine) verifyLease(t *table) error {
	e.leaseMu.Lock()
	defer e.leaseMu.Unlock()
	if (t.holder == 0) != (t.epoch == 0) {
		return fmt.Errorf("holder %d with epoch %d", t.holder, t.epoch)
	}
	if t.holder == 0 && !t.leaseUntil.IsZero() {
		return fmt.Errorf("a lease until %v without a holder", t.leaseUntil)
	}
	if limit := e.opts.Now().Add(e.opts.LeaseDuration); t.leaseUntil.After(limit) {
		return fmt.Errorf("lease until %v, beyond one lease from now (%v)", t.leaseUntil, limit)
	}
	return nil
}

// verifyDiskPages checks the used tree against the published page map, between checkpoints:
// every disk page the map references is used and referenced once, and nothing else is used
// (the pages a checkpoint writes are used only while it runs; the old copies are freed after
// it publishes), except the replaced copies a backup holds (held: used, in no map).
func verifyDiskPages(t *table, held []heldPage) error {
	if t.pages.count() > tablePagesMax {
		return fmt.Errorf("page map of %d pages > tablePagesMax", t.pages.count())
	}
	seen := make(map[uint32]uint64)
	for page, ent := range t.pages.all() {
		if ent.disk == 0 {
			continue
		}
		if prev, ok := seen[ent.disk]; ok {
			return fmt.Errorf("disk page %d holds logical pages %d and %d", ent.disk-1, prev, page)
		}
		seen[ent.disk] = uint64(page)
		if !t.used.Test(uint64(ent.disk - 1)) {
			return fmt.Errorf("disk page %d of logical page %d is free in the used tree", ent.disk-1, page)
		}
	}
	var nHeld uint64
	for _, h := range held {
		if h.t != t {
			continue
		}
		if _, ok := seen[h.disk]; ok || !t.used.Test(uint64(h.disk-1)) {
			return fmt.Errorf("disk page %d held for a backup is mapped or free", h.disk-1)
		}
		nHeld++
	}
	if got := t.used.Count(); got != uint64(len(seen))+nHeld {
		return fmt.Errorf("used tree counts %d disk pages, the page map references %d and backups hold %d", got, len(seen), nHeld)
	}
	return nil
}

// verify checks the cache's accounting: usedBytes, dirtyFrames and dirtyBytes are the sums
// over its live frames; the index maps exactly the live frames; free frame ids and slab slots
// are each owned once.
func (c *pageCache) verify() error {
	var used, dirtyBytes int64
	var live, dirty int
	slots := make(map[[2]int32]int32)
	for id, f := range c.frames {
		if f.key == 0 {
			if f != (frame{}) {
				return fmt.Errorf("free frame %d not zeroed: %+v", id, f)
			}
			continue
		}
		live++
		if int(f.class) >= len(c.slabs) {
			return fmt.Errorf("frame %d in slab %d of %d", id, f.class, len(c.slabs))
		}
		s := c.slabs[f.class]
		cost := c.frameCost(s.pageBytes)
		used += cost
		if f.dirty {
			dirty++
			dirtyBytes += cost
		}
		if f.pins < 0 {
			return fmt.Errorf("frame %d has %d pins", id, f.pins)
		}
		if got, ok := c.index.get(f.key); !ok || got != int32(id) {
			return fmt.Errorf("frame %d (key %#x) indexed as %d, %v", id, f.key, got, ok)
		}
		if f.slot < 0 || f.slot >= s.next {
			return fmt.Errorf("frame %d in slot %d of %d", id, f.slot, s.next)
		}
		k := [2]int32{int32(f.class), f.slot}
		if other, ok := slots[k]; ok {
			return fmt.Errorf("frames %d and %d share slab %d slot %d", other, id, f.class, f.slot)
		}
		slots[k] = int32(id)
	}
	if used != c.usedBytes {
		return fmt.Errorf("usedBytes %d, live frames cost %d", c.usedBytes, used)
	}
	if dirty != c.dirtyFrames || dirtyBytes != c.dirtyBytes {
		return fmt.Errorf("dirty %d frames / %d bytes counted, %d / %d found", c.dirtyFrames, c.dirtyBytes, dirty, dirtyBytes)
	}
	indexed, err := c.index.verify()
	if err != nil {
		return err
	}
	if indexed != live {
		return fmt.Errorf("index holds %d keys for %d live frames", indexed, live)
	}
	if live+len(c.freeIDs) != len(c.frames) {
		return fmt.Errorf("%d live + %d free frame ids != %d frames", live, len(c.freeIDs), len(c.frames))
	}
	for _, id := range c.freeIDs {
		if c.frames[id].key != 0 {
			return fmt.Errorf("free frame id %d is live", id)
		}
	}
	for class, s := range c.slabs {
		for _, slot := range s.free {
			if other, ok := slots[[2]int32{int32(class), slot}]; ok {
				return fmt.Errorf("slab %d slot %d is free and held by frame %d", class, slot, other)
			}
		}
		if int(s.next) != len(s.free)+countClass(slots, class) {
			return fmt.Errorf("slab %d: %d slots handed out, %d free + %d held", class, s.next, len(s.free), countClass(slots, class))
		}
	}
	return nil
}

func countClass(slots map[[2]int32]int32, class int) int {
	n := 0
	for k := range slots {
		if int(k[0]) == class {
			n++
		}
	}
	return n
}

// verify checks the window invariants of dedup.go: n <= dedupWindow and the window holds
// lastSeq-n+1 .. lastSeq, the last at lastLSN.
func (o *ownerState) verify() error {
	if o.n < 0 || o.n > dedupWindow || (o.n > 0 && len(o.window) < o.n) {
		return fmt.Errorf("window of %d entries (allocated %v)", o.n, o.window != nil)
	}
	if uint64(o.n) > o.lastSeq+1 {
		return fmt.Errorf("window of %d entries below seq %d", o.n, o.lastSeq)
	}
	for i := range uint64(o.n) {
		seq := o.lastSeq - i
		if ent := o.window[seq%uint64(len(o.window))]; ent.seq != seq {
			return fmt.Errorf("window slot of seq %d holds seq %d", seq, ent.seq)
		}
	}
	if o.n > 0 && o.window[o.lastSeq%uint64(len(o.window))].lsn != o.lastLSN {
		return fmt.Errorf("last seq %d at LSN %d, window says %d", o.lastSeq, o.lastLSN, o.window[o.lastSeq%uint64(len(o.window))].lsn)
	}
	return nil
}

// verifyTxns checks the two-phase commit's invariants (txn.go): the row locks are exactly
// the prepared parts' slots, the bytes held are their records', and the bounds hold. Caller
// holds mu.
func (e *Engine) verifyTxns() error {
	locks := make(map[uint64]uint64)
	tables := make(map[uint32]int)
	var held int64
	prepared := 0
	for id, p := range e.txnParts {
		if p.id != id {
			return fmt.Errorf("storenode: transaction %v filed under %v", p.id, id)
		}
		if p.decision != base.DecisionNone {
			if p.rec != nil || len(p.batch.Segments) != 0 {
				return fmt.Errorf("storenode: transaction %v applied %v still holds its batch", id, p.decision)
			}
			continue
		}
		held += int64(len(p.rec))
		prepared++
		for i := range p.batch.Segments {
			s := &p.batch.Segments[i]
			k := frameKey(s.Table, s.Page)
			if locks[k]&(s.Data|s.Clear) != 0 {
				return fmt.Errorf("storenode: transaction %v: rows %#x of table %d page %d prepared twice", id, locks[k]&(s.Data|s.Clear), s.Table, s.Page)
			}
			locks[k] |= s.Data | s.Clear
			tables[s.Table]++
		}
	}
	if !maps.Equal(tables, e.txnTables) {
		return fmt.Errorf("storenode: prepared segments per table %v, counted %v", tables, e.txnTables)
	}
	if held != e.txnBytes {
		return fmt.Errorf("storenode: prepared batches hold %d bytes, counted %d", held, e.txnBytes)
	}
	if len(locks) != len(e.txnLocks) {
		return fmt.Errorf("storenode: %d pages locked, the prepared batches lock %d", len(e.txnLocks), len(locks))
	}
	for k, m := range locks {
		if e.txnLocks[k] != m {
			return fmt.Errorf("storenode: table %d page %d: locks %#x, the prepared batches lock %#x", uint32(k>>32), k&(1<<32-1), e.txnLocks[k], m)
		}
	}
	if prepared != e.txnPrepared {
		return fmt.Errorf("storenode: %d parts prepared, counted %d", prepared, e.txnPrepared)
	}
	// Applied parts waiting to report are bounded at a prepare (txnPartsRoom), not here: a
	// replay may rebuild more.
	if prepared > e.opts.MaxTxns || len(e.txnDecisions) > e.opts.MaxTxns || e.txnBytes > e.opts.MaxTxnBytes {
		return fmt.Errorf("storenode: %d parts prepared, %d decisions, %d bytes: past the bounds", prepared, len(e.txnDecisions), e.txnBytes)
	}
	if len(e.txnAbortedQ) > e.opts.MaxTxns || len(e.txnAborted) > len(e.txnAbortedQ) {
		return fmt.Errorf("storenode: %d aborts of unprepared transactions in a queue of %d: past the bounds", len(e.txnAborted), len(e.txnAbortedQ))
	}
	if len(e.txnForgotQ) > e.opts.TxnForgetMax || len(e.txnForgot) > len(e.txnForgotQ) {
		return fmt.Errorf("storenode: %d forgotten decisions in a queue of %d: past the bounds", len(e.txnForgot), len(e.txnForgotQ))
	}
	decisionOwners := make(map[uint64]int)
	for _, d := range e.txnDecisions {
		if d.owner != 0 {
			decisionOwners[d.owner]++
		}
	}
	if !maps.Equal(decisionOwners, e.txnDecisionOwners) {
		return fmt.Errorf("storenode: kept decisions per owner %v, counted %v", decisionOwners, e.txnDecisionOwners)
	}
	for id, d := range e.txnDecisions {
		if d.d != base.DecisionCommit && d.d != base.DecisionAbort || d.count > txnParticipantsMax || d.d == base.DecisionCommit && d.allReported() {
			return fmt.Errorf("storenode: decision of %v: %+v", id, *d)
		}
	}
	return nil
}
