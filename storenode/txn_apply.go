package storenode

import (
	"fmt"
	"time"

	"github.com/weftdb/weft/base"
)

// A participant's apply of a decision (txn.go): ApplyTxn writes or drops the prepared part,
// unlocks its rows and keeps it to be reported.

// ApplyTxn applies the decision d of transaction id at this participant: commit writes the
// prepared batch (as a Commit would, at the apply record's LSN), abort drops it; either way
// the rows are unlocked and the participant reports to the primary (its resolver, soon).
// Applying the same decision again is a no-op; the other one fails with ErrTxnDecided; an
// unknown id is no error (applied and reported before, or never prepared here: a
// coordinator sends commit only after every prepare was acknowledged, and a prepared part is
// kept until its decision is applied). An abort of an unknown id is remembered for
// Options.TxnAbortKeep: the transaction's prepare, if it comes after, is refused with
// ErrTxnDecided. It returns once the apply record is synced.
func (e *Engine) ApplyTxn(id base.TxnID, d base.Decision) error {
	return e.applyTxn(id, d, decider{any: true})
}

// applyTxn is ApplyTxn from by: a part prepared here by another owner than by's is refused,
// untouched (ApplyTxnAs), under the same hold of the engine lock as the apply.
func (e *Engine) applyTxn(id base.TxnID, d base.Decision, by decider) error {
	if d != base.DecisionCommit && d != base.DecisionAbort {
		return fmt.Errorf("%w: decision %d", ErrMalformed, d)
	}
	e.mu.Lock()
	if p := e.txnParts[id]; !by.any && p != nil && p.decision == base.DecisionNone && p.batch.Owner != by.owner {
		e.mu.Unlock()
		return fmt.Errorf("storenode: transaction %v: the part here was prepared by another owner: %w", id, base.ErrForbidden)
	}
	lsn, err := e.applyTxnLocked(id, d)
	e.mu.Unlock()
	if err != nil || lsn == 0 {
		return err
	}
	if err := e.waitDurable(lsn); err != nil {
		return err
	}
	e.kickResolver()
	return nil
}

func (e *Engine) applyTxnLocked(id base.TxnID, d base.Decision) (uint64, error) {
	if e.replicated() {
		return e.applyTxnProposed(id, d) // txn_repl.go
	}
	var stallStart time.Time
	for {
		if err := e.usable(); err != nil {
			return 0, err
		}
		p := e.txnParts[id]
		if p == nil {
			if d == base.DecisionAbort {
				e.noteAbortedUnprepared(id)
			}
			return 0, nil
		}
		if p.decision != base.DecisionNone {
			if p.decision != d {
				return 0, fmt.Errorf("%w: transaction %v: this participant applied %v", ErrTxnDecided, id, p.decision)
			}
			return p.lsn, nil
		}
		if d == base.DecisionCommit {
			room, err := e.reserveFrames(&p.batch)
			if err != nil {
				return 0, err
			}
			if !room {
				if stallStart.IsZero() {
					stallStart = time.Now()
				}
				gen := e.ckptGen
				e.trig.stalled = true // a stall like a commit's (cacheTrigger)
				e.requestCheckpoint()
				for e.ckptGen == gen && e.usable() == nil {
					e.cond.Wait()
				}
				continue
			}
		}
		if !stallStart.IsZero() {
			e.stats.noteStall(time.Since(stallStart))
		}
		if err := e.carryPartFirst(p); err != nil {
			return 0, err
		}
		e.scratch = appendTxnApplyRecord(e.scratch[:0], id, d, p.index, p.primary)
		lsn, err := e.appendRecord(kindTxnApply, e.scratch, true, noAck)
		if err != nil {
			if d == base.DecisionCommit {
				e.unpinFrames(&p.batch, len(p.batch.Segments))
			}
			return 0, err
		}
		e.finishPart(p, d, lsn)
		if e.cachePressure() || e.walPressure() {
			e.requestCheckpoint()
		}
		return lsn, nil
	}
}

// noteAbortedUnprepared remembers an abort applied to a transaction not prepared here, so
// that its prepare, still on its way (a coordinator that gave up waiting for it aborts
// every participant: a prepare runs on a goroutine of its own and may land after the
// abort), is refused instead of locking its rows until a resolver hears the primary's
// abort, or, once the primary forgot it, until the coordinator's lease ends. Kept
// Options.TxnAbortKeep (the primary's own keep), at most Options.MaxTxns of them (the
// oldest give way). Caller holds mu.
func (e *Engine) noteAbortedUnprepared(id base.TxnID) {
	now := e.opts.Now()
	e.expireAbortedUnprepared(now) // O(1) amortized: txnAbortedQ, oldest first (txn_forget.go)
	if len(e.txnAbortedQ) >= e.opts.MaxTxns {
		e.popAbortedUnprepared()
	}
	e.txnAborted[id] = now
	e.txnAbortedQ = append(e.txnAbortedQ, txnAbortedEntry{id: id, at: now})
}

// finishPart applies (commit: frames reserved) or drops a prepared part at lsn and keeps it
// as applied, to be reported. Caller holds mu.
func (e *Engine) finishPart(p *txnPart, d base.Decision, lsn uint64) {
	e.unlockPart(p)
	e.txnPrepared--
	e.txnBytes -= int64(len(p.rec))
	e.ownerQuotaAdd(p.batch.Owner, -1, -len(p.rec))
	if d == base.DecisionCommit {
		e.applyBatch(&p.batch, lsn)
		e.unpinFrames(&p.batch, len(p.batch.Segments))
		e.stats.txnCommits.Add(1)
	} else {
		e.stats.txnAborts.Add(1)
	}
	p.decision, p.lsn, p.rec, p.batch = d, lsn, nil, base.Batch{}
}
