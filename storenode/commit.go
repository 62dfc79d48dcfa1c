package storenode

import (
	"fmt"
	"math/bits"
	"time"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/assert"
	"github.com/weftdb/weft/logicpage"
)

// The commit path. Under mu, in one critical section per batch: check the owner's seq order
// and fences, reserve a cache frame for every page the batch touches (partial frames, no read
// before write), apply the rows, update the bitmap-trees, take the next LSN and hand the record
// to the WAL: the batch's Commit body (records.go) as a gather list, the received body copied,
// or (a batch without one) headers copied and large runs of rows written from the caller's
// memory. The WAL acknowledges in LSN order once the record is written
// (and synced, per the sync mode); only then does done report success.
//
// Rows reach the cache before their record is durable. That is safe: the owner that sent them
// is the only writer of the table and may read its own writes; every other reader waits until
// the table's last write is durable (ReadRowsAs, PageDirAs); a failed WAL write makes the
// engine fail-stop (reads stop too); and a checkpoint syncs the WAL through everything it
// copied before it publishes, so no checkpoint can hold half of a batch that recovery does not
// replay whole.

// Commit applies a batch and calls done once, with the batch's LSN when it is durable or with
// the error that stopped it. done may run on the calling goroutine (errors, retried batches) or
// on the WAL's goroutine; it must be quick and must not call back into the engine's blocking
// methods. Commit may block: while a batch waits for the batches before it in its owner's seq
// order (at most Options.SeqGapWait), and while the cache waits for a checkpoint to make room.
//
// A batch whose seq the owner already applied is not applied again (see dedup.go): if it is
// the same batch (same hash) done reports its own LSN once that is durable; if not, it fails
// with ErrSeqReused; a seq older than the dedup window fails with ErrUnknownOutcome.
//
// Commit does not retain b, its slices or b.Body once it returns, but for a batch without a
// Body the WAL may write the segments' rows from the caller's memory: they must not change
// until done has run (the transaction node's batches do not change until acknowledged). A batch
// whose WAL write or fsync failed gets an error wrapping ErrUnknownOutcome and ErrFailStop:
// it may be found after a restart. The dedup window is consulted before the fail-stop check: a
// retry after a fail-stop gets the outcome of the batch it repeats (durable: its LSN; in
// doubt: ErrUnknownOutcome), and only a batch never applied fails with a plain ErrFailStop.
func (e *Engine) Commit(b *base.Batch, done func(lsn uint64, err error)) {
	if err := e.commit(b, done); err != nil {
		done(0, err)
	}
}

// CommitWait is Commit that waits for the outcome.
func (e *Engine) CommitWait(b *base.Batch) (uint64, error) {
	type result struct {
		lsn uint64
		err error
	}
	ch := make(chan result, 1)
	e.Commit(b, func(lsn uint64, err error) { ch <- result{lsn, err} })
	r := <-ch
	return r.lsn, r.err
}

// admitChecks is the check of a commit batch b of owner entry o (nil: none) that no wait
// changes, standalone and under a Proposer alike: its fences and rows (checkBatch), rows
// locked by a prepared transaction, and a fresh owner's refused seqs. A refusal of the first
// two is noted (noteRefused). Caller holds mu.
func (e *Engine) admitChecks(b *base.Batch, o *ownerState) error {
	if err := e.checkBatch(b); err != nil {
		e.noteRefused(b.Owner, o, b.Seq)
		return err
	}
	if err := e.checkTxnLocks(b.Segments); err != nil {
		e.noteRefused(b.Owner, o, b.Seq)
		return err
	}
	if o == nil {
		return e.freshRefusedGap(b.Owner, b.Seq)
	}
	return nil
}

func (e *Engine) commit(b *base.Batch, done func(uint64, error)) error {
	if b.Owner == 0 || b.Owner == MoveWriter || b.Seq == 0 {
		return fmt.Errorf("%w: batch with owner %d seq %d", ErrMalformed, b.Owner, b.Seq)
	}
	hash := batchHash(b) // outside mu: it reads every row
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.opts.Proposer != nil {
		return e.commitProposed(b, hash, done)
	}
	var gapDeadline time.Time
	var stallStart time.Time
	for {
		if e.closed {
			return ErrClosed
		}
		// The dedup window before the fail-stop check: a batch applied before the failure has
		// the outcome it had (durable: acknowledged; its write failed: unknown), never the
		// definite failure of a batch the failure kept out.
		o := e.owners[b.Owner] // nil until the owner's first applied batch
		if o != nil && b.Seq <= o.lastSeq {
			lsn, err := o.retried(b, hash)
			if err != nil {
				return err
			}
			e.stats.retried.Add(1)
			e.mu.Unlock()
			e.ackWhenDurable(lsn, done)
			e.mu.Lock()
			return nil
		}
		if err := e.failure(); err != nil {
			return err
		}
		// Fences before any wait: a stale owner is rejected at once, never held back.
		if err := e.admitChecks(b, o); err != nil {
			return err
		}
		// An owner the table does not know (new, or expired) starts its window at any seq.
		if o != nil && b.Seq > o.lastSeq+1 {
			if err := o.refusedGap(b.Seq); err != nil {
				return err
			}
			if gapDeadline.IsZero() {
				gapDeadline = time.Now().Add(e.opts.SeqGapWait)
				timer := time.AfterFunc(e.opts.SeqGapWait, e.wake)
				defer timer.Stop()
			}
			if !time.Now().Before(gapDeadline) {
				return fmt.Errorf("%w: batch seq %d, last applied %d", ErrSeqGap, b.Seq, o.lastSeq)
			}
			e.gapWaiters++
			e.cond.Wait()
			e.gapWaiters--
			continue
		}
		room, err := e.reserveFrames(b)
		if err != nil {
			return err
		}
		if room {
			break
		}
		// The cache is full of dirty pages: wait for a checkpoint to clean some.
		if stallStart.IsZero() {
			stallStart = time.Now()
		}
		gen := e.ckptGen
		e.trig.stalled = true
		e.requestCheckpoint()
		for e.ckptGen == gen && e.usable() == nil {
			e.cond.Wait()
		}
	}
	if !stallStart.IsZero() {
		e.stats.noteStall(time.Since(stallStart))
	}
	lsn, err := e.appendPieces(kindCommit, e.commitPieces(b, hash), false, done)
	clear(e.pieces) // the WAL holds what it keeps; drop the engine's references
	if err != nil {
		e.unpinFrames(b, len(b.Segments))
		return err
	}
	e.applyCommitBatch(b, hash, lsn)
	e.stats.commits.Add(1)
	e.cond.Broadcast() // the owner's next seq may be waiting
	if e.cachePressure() || e.walPressure() {
		e.requestCheckpoint()
	}
	return nil
}

// noteRefused records that owner's batch of seq, not applied yet, was refused before
// anything of it was applied (its fences, its locks): the owner's later batches held back for
// the gap at seq fail at once (refusedGap) instead of waiting Options.SeqGapWait each, one
// after another on their connection. o is owner's entry, nil before its first applied batch:
// such an owner starts its window at any seq, so its refusal is kept in refusedFresh, and its
// later seqs are refused (freshRefusedGap) rather than starting the window past the refused
// one (a transaction of a later batch may have read a row of the refused one). Memory only.
// Caller holds mu.
func (e *Engine) noteRefused(owner uint64, o *ownerState, seq uint64) {
	if o == nil {
		if r, ok := e.refusedFresh[owner]; ok && r <= seq {
			return
		}
		if e.refusedFresh == nil {
			e.refusedFresh = make(map[uint64]uint64)
		}
		if _, ok := e.refusedFresh[owner]; !ok && len(e.refusedFresh) >= refusedFreshMax {
			now := e.opts.Now()
			for id := range e.refusedFresh { // owners gone (no live identity) first
				if !e.hasIdent(id, now) {
					delete(e.refusedFresh, id)
				}
			}
			if len(e.refusedFresh) >= refusedFreshMax {
				return // bounded: a storage node has far fewer new owners refused at once
			}
		}
		e.refusedFresh[owner] = seq
		return
	}
	if seq <= o.lastSeq || (o.refused > o.lastSeq && o.refused <= seq) {
		return
	}
	o.refused = seq
	e.cond.Broadcast() // the batches already waiting for the gap
}

// refusedFreshMax bounds Engine.refusedFresh.
const refusedFreshMax = 4096

// freshRefusedGap is refusedGap for owner without an owners-table entry: its batch of seq
// fails with ErrSeqGap if a batch of a lower seq was refused (noteRefused) and not sent
// again since. Caller holds mu.
func (e *Engine) freshRefusedGap(owner, seq uint64) error {
	if r, ok := e.refusedFresh[owner]; ok && r < seq {
		return fmt.Errorf("%w: batch seq %d, no batch applied yet: the batch of seq %d was refused", ErrSeqGap, seq, r)
	}
	return nil
}

// wake broadcasts the engine's condition (timers use it to end bounded waits).
func (e *Engine) wake() {
	e.mu.Lock()
	e.cond.Broadcast()
	e.mu.Unlock()
}

// owner returns owner id's entry of the owners table, creating it: only for an applied batch.
// It marks the owner active. Caller holds mu.
func (e *Engine) owner(id uint64) *ownerState {
	o := e.owners[id]
	if o == nil {
		o = &ownerState{}
		e.owners[id] = o
	}
	o.active = e.opts.Now()
	return o
}

// checkBatch validates a batch against the catalog and the fences. Caller holds mu.
func (e *Engine) checkBatch(b *base.Batch) error {
	if len(b.Segments) == 0 {
		return fmt.Errorf("%w: batch without segments", ErrMalformed)
	}
	now := e.opts.Now()
	for _, f := range b.Fences {
		t, err := e.table(f.Table)
		if err != nil {
			return err
		}
		if err := e.checkFence(t, b.Owner, f.Epoch); err != nil {
			return err
		}
		e.setLease(t, now.Add(e.opts.LeaseDuration))
	}
	for i := range b.Segments {
		s := &b.Segments[i]
		t, err := e.table(s.Table)
		if err != nil {
			return err
		}
		if !fenced(b.Fences, s.Table) {
			return fmt.Errorf("%w: segment of table %d without a fence", ErrMalformed, s.Table)
		}
		if e.moves != nil {
			if err := e.moveRefuses(t); err != nil {
				return err
			}
		}
		if s.Page >= tablePagesMax {
			return fmt.Errorf("%w: page %d of table %q beyond a table's last page %d", ErrMalformed, s.Page, t.name, tablePagesMax-1)
		}
		if err := t.geo.CheckSegment(*s); err != nil {
			return fmt.Errorf("%w: table %q: %w", ErrMalformed, t.name, err)
		}
		if t.cluster.IsCluster() && t.cluster.PartitionOfPage(s.Page) != t.cluster.Partition {
			return fmt.Errorf("%w: page %d of table %q is in partition %d, the table holds partition %d",
				ErrMalformed, s.Page, t.name, t.cluster.PartitionOfPage(s.Page), t.cluster.Partition)
		}
		// Only granted ids may be written: the page map grows to the highest page a
		// checkpoint sees, so one row far past the grants would make it enormous. An empty
		// segment writes no row but still dirties its page: it may name only a page whose
		// first id was granted.
		last := s.Page * logicpage.RowsPerPage
		if slots := s.Data | s.Clear; slots != 0 {
			last += uint64(63 - bits.LeadingZeros64(slots))
		}
		if last >= t.nextID {
			return fmt.Errorf("%w: row %d of table %q was never granted (next id %d)", ErrMalformed, last, t.name, t.nextID)
		}
	}
	return nil
}

func fenced(fences []base.Fence, table uint32) bool {
	for _, f := range fences {
		if f.Table == table {
			return true
		}
	}
	return false
}

// reserveFrames makes sure every page of b has a frame. It reports false when the cache has no
// clean frame left to evict (the caller waits for a checkpoint), and lets a batch exceed the
// budget only when nothing is dirty, i.e. the batch alone is larger than the cache.
//
// The reserved frames are pinned: a frame reserved for an earlier segment is clean (and, when
// new, empty) until the batch is applied, so without the pin the eviction that makes room for
// a later segment could take it, and the batch would be applied to a frame that is gone. On
// success the caller unpins them (unpinFrames) once the batch is applied or abandoned; on
// failure they are unpinned here.
func (e *Engine) reserveFrames(b *base.Batch) (bool, error) {
	for i := range b.Segments {
		s := &b.Segments[i]
		key := frameKey(s.Table, s.Page)
		if id, ok := e.cache.lookup(key); ok {
			e.cache.frames[id].ref = true
			e.cache.frames[id].pins++
			continue
		}
		t := e.tables[s.Table]
		force := e.cache.dirtyFrames == 0 || e.replayForce
		if force && len(b.Segments) > 1<<16 {
			e.unpinFrames(b, i)
			return false, fmt.Errorf("%w: %d segments", ErrBatchTooLarge, len(b.Segments))
		}
		id, ok := e.cache.alloc(key, t.geo.PageBytes(), force)
		if !ok {
			e.unpinFrames(b, i)
			return false, nil
		}
		e.cache.frames[id].pins++
	}
	return true, nil
}

// unpinFrames unpins the frames reserveFrames pinned for the first n segments of b.
func (e *Engine) unpinFrames(b *base.Batch, n int) {
	for i := range b.Segments[:n] {
		s := &b.Segments[i]
		id, ok := e.cache.lookup(frameKey(s.Table, s.Page))
		if !(ok && e.cache.frames[id].pins > 0) {
			assert.Failf("storenode: pinned frame of table %d page %d is gone", s.Table, s.Page)
		}
		e.cache.frames[id].pins--
	}
}

// applyBatch writes b's rows into the cache and the bitmap-trees. Caller holds mu and has
// reserved the frames.
func (e *Engine) applyBatch(b *base.Batch, lsn uint64) {
	for i := range b.Segments {
		e.applySegment(&b.Segments[i], lsn)
	}
}

func (e *Engine) applySegment(s *base.Segment, lsn uint64) {
	t := e.tables[s.Table]
	id, _ := e.cache.lookup(frameKey(s.Table, s.Page))
	var m logicpage.Masks
	t.geo.Frame(e.cache.rows(id), &m).Apply(*s)
	f := &e.cache.frames[id]
	f.valid |= s.Data | s.Clear
	t.writeLSN = max(t.writeLSN, lsn)
	e.cache.markDirty(id, lsn)
	base := s.Page * logicpage.RowsPerPage
	for m := s.Data; m != 0; m &= m - 1 {
		t.rows.Set(base + uint64(bits.TrailingZeros64(m)))
	}
	for m := s.Clear; m != 0; m &= m - 1 {
		t.rows.Clear(base + uint64(bits.TrailingZeros64(m)))
	}
	if !e.replaying { // rows_written counts commits since Open, not the WAL replayed at it
		e.stats.rowsWritten.Add(uint64(bits.OnesCount64(s.Data | s.Clear)))
	}
	if e.moves != nil {
		e.moveNoteWrite(s)
	}
}
