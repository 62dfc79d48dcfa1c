package txnode

import (
	"context"
	"errors"
	"fmt"

	"github.com/weftdb/weft/internal/assert"
)

// Recovery from a refused batch (Durable). A commit batch the store refuses as fenced (a
// table's grant taken by another owner, a partition frozen for a move: ErrMoved) or as naming
// a table it no longer has (ErrTableNotFound) was not applied: its outcome is known. The
// pipeline then fails what is not acknowledged and goes on, instead of failing for good:
//
//  1. Every commit with a version from the refused batch's first to the last version given so
//     far fails (failRange): the cache installed them before they were durable, so later ones
//     may have read the refused rows. Their durable waiters return the range's error
//     (ErrConflict wrapping the refusal's text, not its sentinel: DB.Update runs them again),
//     even once durableVer passes the range (waitDurable and the Durable read paths check
//     verFailed after loading durableVer). The open batch is dropped unsent. But the
//     committers of a batch in flight after the refused one are answered only when that
//     batch comes back (holdLaterLocked, answerHeldLocked): a storage node that forgot the
//     refusal may apply it. Their readers fail with the range at once.
//  2. No commit is admitted and no batch launched (rec) until the recovery ends. Batches in
//     flight come back: acknowledged if before the refused seq (durable), refused or
//     ErrSeqGap after it (the storage node fails an owner's later seqs at once once one is
//     refused). An acknowledgement after the refused seq, or any unknown outcome, fails the
//     pipeline for good, as before (the acknowledged batch's committers get nil: it is
//     applied; see answerHeldLocked).
//  3. The recovery waits until every batch in flight is back, a 2PC prepare holding a later
//     seq has ended (prepHold; its ErrSeqGap now ends it as not taken), and every commit of
//     the range has installed (installing): then it invalidates the frames of every failed
//     batch once more, so no row a refused commit installed late stays valid in the cache.
//  4. It asks the store again for the grant of each table of the refused batches
//     (latchRefused): a fence or a table gone latches the table as not served, as renewals
//     do. If none latches, or the store cannot answer, the refusal is unexplained and the
//     pipeline fails for good.
//  5. A batch of the range sent on a connection that has been replaced since may have been
//     sent again (the remote store resends batches in flight on a new connection): a late
//     copy must never apply after the seq is reused, so then the pipeline fails for good.
//  6. The next batch takes the lowest refused seq (the storage node expects it again), and
//     commits are admitted again; a transaction that read a version of a failed range fails
//     at admission (add: readFailed), however late it commits, with the range's error; one
//     that waited for the recovery checks its tables' serving again (a fenced table's
//     transaction gets the table's error).
//
// WriteBack never recovers: its epochs hold acknowledged writes of every table, so a refused
// epoch fails the pipeline for good, as before.

// recovery is the state of a recovery in progress; guarded by pipeline.mu.
type recovery struct {
	seq    uint64 // the lowest refused seq: the next batch's
	lo, hi uint64 // the failed range (versions)
	cause  error
	err    error         // what the range's commits return
	frames []frameRef    // of every failed batch, invalidated again at the end
	tables []*tableState // of the refused batches
	// resent: a batch of the range was launched on an earlier connection of the store than
	// the one it came back on (step 5).
	resent bool
	// applied is the highest version installApplied gave during the recovery: durable at its
	// end.
	applied uint64
}

// knownRefusal reports whether err is a refusal that leaves the batch not applied and
// explains itself by a table: a fence or a table gone at the store.
func knownRefusal(err error) bool {
	if errors.Is(err, ErrUnknownOutcome) {
		return false
	}
	return errors.Is(err, ErrFenced) || errors.Is(err, ErrTableNotFound)
}

// refusedLocked takes b's error err into a recovery, starting one if needed; it reports
// false when err must fail the pipeline for good. Caller holds mu.
func (p *pipeline) refusedLocked(b *batch, err error) bool {
	db := p.db
	if db.opts.Durability != Durable || p.closing || p.abandoned {
		if db.opts.Durability == Durable && !p.abandoned && knownRefusal(err) {
			// Closing: the pipeline fails for good, but the batches in flight after b still
			// come back (or Close gives up on them: abandonLocked), and a store that forgot
			// the refusal may apply them: their committers wait for that (waitVer).
			p.holdLaterLocked(b.seq)
		}
		return false
	}
	if rec := p.rec; rec != nil {
		if !knownRefusal(err) && !isSeqGap(err) {
			return false
		}
		rec.tables = appendTables(rec.tables, b.tables)
		if b.seq < rec.seq {
			// An earlier batch refused too (its answer came later): the range reaches down
			// to it.
			p.holdLaterLocked(b.seq)
			if b.firstVer < rec.lo && !db.failRange(b.firstVer, rec.lo-1, rec.err) {
				return false
			}
			rec.seq, rec.lo = b.seq, min(rec.lo, b.firstVer)
		}
		return true
	}
	if !knownRefusal(err) && !(isSeqGap(err) && p.earlierInFlightLocked(b)) {
		// (ErrSeqGap with an earlier batch still out: its refusal is on its way, as the
		// storage node fails the later seqs at once; answers may come in any order. If none
		// comes, nothing latches and the recovery fails the pipeline for good.)
		return false
	}
	rec := &recovery{seq: b.seq, lo: b.firstVer, hi: db.commitVer.Load(), cause: err}
	rec.err = fmt.Errorf("%w: commit batch %d was refused by the store (%v): nothing of this transaction was applied; run it again",
		ErrConflict, b.seq, err)
	p.holdLaterLocked(b.seq)
	if !db.failRange(rec.lo, rec.hi, rec.err) {
		return false
	}
	rec.tables = appendTables(rec.tables, b.tables)
	db.opts.Logger.Warn("txnode: commit batch refused; failing the commits not acknowledged and going on",
		"seq", b.seq, "versions", fmt.Sprintf("%d..%d", rec.lo, rec.hi), "err", err)
	p.rec = rec
	p.recovering.Store(true)
	if o := p.open; o.nTx > 0 {
		// Never sent: its commits fail with the range, its frames are invalidated now and
		// again at the end, and it settles once the batches before it have.
		db.cache.invalidateRefs(o.frames, false)
		rec.frames = append(rec.frames, o.frames...)
		p.unsentVer = max(p.unsentVer, o.lastVer)
		p.flightBytes -= batchCost(o)
		p.open = p.newBatchLocked()
		o.retired, o.returned = true, true
		p.recycleLocked(o)
	}
	// close sets closing under mu before it waits for bg: this Add comes before that Wait.
	p.bg.Add(1)
	go p.recover(rec)
	return true
}

// holdLaterLocked holds the batches in flight after seq (the refused one's) whose outcome is
// not known yet: the failed range fails their readers at once, but their committers are
// answered only when each comes back (answerHeldLocked), as a storage node that forgot the
// refusal may still apply one (its refusals are kept in memory only, and bounded). Called
// before the range holding them is recorded. Caller holds mu.
func (p *pipeline) holdLaterLocked(seq uint64) {
	for _, x := range p.inflight {
		if x.seq > seq && !x.held && !(x.completed && x.err != nil) {
			x.held = true
			p.db.holdVers(x.firstVer, x.lastVer)
		}
	}
}

// answerHeldLocked answers the committers of the held batch x as it retires (every batch
// before it has: the failed range below it is final):
//   - refused or ErrSeqGap: not applied; the failed range's ErrConflict. But if x may have
//     been sent again on a new connection (step 5), a late copy could still apply: an error
//     wrapping ErrUnknownOutcome.
//   - acknowledged: the store applied it after an earlier seq was refused, breaking the
//     owner's order, so the pipeline fails for good (later commits get ErrUnknownOutcome).
//     x's committers get nil, as it is applied and durable, unless what one read came from a
//     batch that was not applied, or whose outcome is unknown (okBelow): then an error
//     wrapping ErrUnknownOutcome (applied, on reads that may never have happened), never
//     ErrConflict.
//   - any other error (the connection died, ...): that error, wrapped.
//
// Caller holds mu.
func (p *pipeline) answerHeldLocked(x *batch) {
	x.held = false
	db := p.db
	switch {
	case x.err == nil:
		okBelow := min(db.failedFloor(x.firstVer)+1, p.failVer, x.firstVer)
		db.releaseHeld(x.firstVer, x.lastVer, false, nil, okBelow)
		p.failLocked(x, fmt.Errorf("%w: commit batch %d was acknowledged after an earlier batch of this node was refused: the store broke the owner's order",
			ErrUnknownOutcome, x.seq))
		x.err = p.failErr
	case knownRefusal(x.err) || isSeqGap(x.err):
		if x.gen != p.connGen() {
			db.releaseHeld(x.firstVer, x.lastVer, false, fmt.Errorf("%w: commit batch %d was refused (%v), but it may have been sent again on a new connection: a late copy could apply",
				ErrUnknownOutcome, x.seq, x.err), 0)
			return
		}
		db.releaseHeld(x.firstVer, x.lastVer, true, nil, 0)
	default:
		db.releaseHeld(x.firstVer, x.lastVer, false, fmt.Errorf("txnode: commit batch %d: %w", x.seq, x.err), 0)
	}
}

// recover ends the recovery rec (see the top of this file) on its own goroutine.
func (p *pipeline) recover(rec *recovery) {
	defer p.bg.Done()
	db := p.db
	p.mu.Lock()
	for (len(p.inflight) > 0 || p.prepHold || p.installing.Load() > 0) && p.failErr == nil && !p.closing {
		p.room.Wait()
	}
	if p.failErr != nil || p.closing {
		p.endRecoveryLocked(rec)
		p.mu.Unlock()
		return
	}
	// Every commit of the range has installed, every batch is back: the last invalidation.
	db.cache.invalidateRefs(rec.frames, false)
	resent := rec.resent
	tables := rec.tables
	p.mu.Unlock()

	var why error
	if resent {
		why = fmt.Errorf("%w: a batch of the refused range was sent again on a new connection: a late copy could apply", ErrUnknownOutcome)
	} else {
		latched := 0
		for _, t := range tables {
			ctx, cancel := context.WithTimeout(context.Background(), db.opts.RequestTimeout)
			go func() { // Close ends the question
				select {
				case <-p.stop:
					cancel()
				case <-ctx.Done():
				}
			}()
			ok, err := db.latchRefused(ctx, t)
			cancel()
			if err != nil {
				why = fmt.Errorf("txnode: after commit batch %d was refused, the store did not answer for table %q: %w", rec.seq, t.name, err)
				break
			}
			if ok {
				latched++
			}
		}
		if why == nil && latched == 0 {
			why = fmt.Errorf("txnode: commit batch %d was refused (%w), yet every table of it is still granted", rec.seq, rec.cause)
		}
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	if why != nil && p.failErr == nil && !p.closing {
		// The refusal's cause, wrapped: later commits are refused at admission (nothing
		// applied), as they were before recoveries, with the fence they stop on.
		p.failErr = fmt.Errorf("txnode: commit batch %d: %w; the node stops committing: %v", rec.seq, rec.cause, why)
		p.stopped.Store(true)
		p.failVer = min(p.failVer, rec.hi+1)
		db.failDurable(p.failVer)
		db.opts.Logger.Error("txnode: recovery from a refused commit batch failed; the node stops committing", "seq", rec.seq, "err", why)
	}
	if p.failErr == nil && !p.closing {
		// - The seq order starts again at the refused seq, the storage node's next: every
		//   batch is back (step 3) and none launched since (rec is set).
		assert.That(len(p.inflight) == 0, "txnode: commit seq reset with batches in flight")
		p.nextSeq = rec.seq
		p.launchedSeq, p.retiredSeq = rec.seq-1, rec.seq-1
		if rec.applied > 0 && len(p.inflight) == 0 {
			db.advanceDurable(rec.applied)
			p.settleLocked(rec.applied)
		}
		db.opts.Logger.Info("txnode: recovered from a refused commit batch", "seq", rec.seq)
	}
	p.endRecoveryLocked(rec)
}

// endRecoveryLocked clears the recovery and wakes whoever waits for it. Caller holds mu.
func (p *pipeline) endRecoveryLocked(rec *recovery) {
	if p.rec == rec {
		p.rec = nil
		p.recovering.Store(false)
	}
	p.room.Broadcast()
	if p.open.nTx > 0 {
		p.kickNow()
	}
}

// appendTables appends the tables of ts not in dst yet.
func appendTables(dst, ts []*tableState) []*tableState {
	for _, t := range ts {
		if !hasTable(dst, t) {
			dst = append(dst, t)
		}
	}
	return dst
}

// connGen is the store's connection generation (a remote store's; 0 for a store that never
// sends a batch twice). Called without mu (the remote store's lock is taken inside).
func (p *pipeline) connGen() uint64 {
	if rs, ok := p.db.store.(*remoteStore); ok {
		return rs.connGen()
	}
	return 0
}

// readFailed returns the error of a failed range holding a version tx read (a row, or a
// page's version), nil when none: such a transaction read rows that were never applied.
func (tx *Tx) readFailed() error {
	db := tx.db
	hi := db.failHi.Load()
	for i := range tx.reads {
		if v := tx.reads[i].ver; v <= hi {
			if err := db.verFailed(v); err != nil {
				return err
			}
		}
	}
	for i := range tx.pageReads {
		if v := tx.pageReads[i].ver; v <= hi {
			if err := db.verFailed(v); err != nil {
				return err
			}
		}
	}
	return nil
}

// seqGapRecovering reports whether err is the storage node's ErrSeqGap for the prepare of seq
// because a batch before it was refused: the prepare was not applied (it takes no seq) and
// must end for the recovery to end. The storage node may answer the prepare before the
// refused batch's answer reaches the pipeline (the two answers come on different
// goroutines), so it first waits, honouring ctx, until no batch before seq is out: then a
// refusal has started the recovery, or none came (the gap is unexplained: false, the
// prepare's outcome stays unknown).
func (p *pipeline) seqGapRecovering(ctx context.Context, err error, seq uint64) bool {
	if !isSeqGap(err) {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rec == nil && p.failErr == nil && p.earlierOutLocked(seq) {
		if h := p.db.testHookWait; h != nil {
			h("seqgap")
		}
		if p.waitRoomLocked(ctx, func() bool {
			return p.rec != nil || p.failErr != nil || p.closing || !p.earlierOutLocked(seq)
		}) != nil {
			return false
		}
	}
	return p.rec != nil
}

// earlierOutLocked reports whether a batch of a seq before seq is in flight and not back
// yet. Caller holds mu.
func (p *pipeline) earlierOutLocked(seq uint64) bool {
	for _, x := range p.inflight {
		if x.seq < seq && !x.completed {
			return true
		}
	}
	return false
}

// isSeqGap reports whether err is the storage node's ErrSeqGap: the batch was not applied.
func isSeqGap(err error) bool {
	return errors.Is(err, errSeqGap) && !errors.Is(err, ErrUnknownOutcome)
}

// earlierInFlightLocked reports whether a batch before b is in flight and not back yet.
// Caller holds mu.
func (p *pipeline) earlierInFlightLocked(b *batch) bool {
	return p.earlierOutLocked(b.seq)
}
