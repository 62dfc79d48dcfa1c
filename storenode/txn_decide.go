package storenode

import (
	"context"
	"fmt"
	"time"

	"github.com/weftdb/weft/base"
)

// The primary's side of two-phase commit (txn.go): recording a transaction's decision
// (DecideTxn), answering a participant's Ask, and noting the participants' reports.

// DecideTxn records the decision d of transaction id at this node, its primary: a
// compare-and-set. The first decision is logged (synced) and kept; the same decision again
// returns it; a different one fails with ErrTxnDecided naming the recorded one. count is the
// number of participants (1..64 for commit; 0..64 for abort, 0 when unknown), numbered as
// their TxnPrepare.Index: the record is kept until each reported (ReportTxn). A commit is
// refused, and abort recorded instead (ErrTxnDecided, "abort"), when the LeaseChecker says
// lease is gone: a coordinator whose lease expired may have been resolved against already.
// A decision already recorded is answered without the lease check (a resent Decide learns
// the outcome while etcd is unreachable). ctx bounds the lease check; the wait for the
// record's sync is bounded by the disk. A decision is recorded only for a transaction whose
// prepared part this node holds as its primary (decideGuard, txn_guard.go): an abort of an id
// it holds no part of is answered without a record, a commit refused with ErrTxnNotPrepared.
// DecideTxn does not check which owner prepared the part (an embedded engine's caller is
// trusted); DecideTxnAs does.
func (e *Engine) DecideTxn(ctx context.Context, id base.TxnID, lease int64, d base.Decision, count int) (base.Decision, error) {
	return e.decideTxn(ctx, decider{any: true}, id, lease, d, count)
}

func (e *Engine) decideTxn(ctx context.Context, owner decider, id base.TxnID, lease int64, d base.Decision, count int) (base.Decision, error) {
	switch {
	case d != base.DecisionCommit && d != base.DecisionAbort:
		return base.DecisionNone, fmt.Errorf("%w: decision %d", ErrMalformed, d)
	case count < 0 || count > txnParticipantsMax || d == base.DecisionCommit && count == 0:
		return base.DecisionNone, fmt.Errorf("%w: %v of %d participants", ErrMalformed, d, count)
	}
	asked := d
	// A decision already recorded is the answer (a coordinator resends its Decide when the
	// answer was lost): it needs no lease check, which fails while etcd is unreachable.
	e.mu.Lock()
	var got txnDecision
	recorded := false
	if err := e.usable(); err != nil {
		e.mu.Unlock()
		return base.DecisionNone, err
	}
	if err := e.checkLeader(); err != nil { // a follower's decisions may lag the log
		e.mu.Unlock()
		return base.DecisionNone, err
	}
	if rec := e.txnDecisions[id]; rec != nil {
		got, recorded = *rec, true
		// A resolver's abort (the only decision recorded without a count) learns it
		// from the coordinator, whatever it asks, as decideLocked does.
		e.learnCount(id, rec, count)
	}
	if !recorded {
		got, recorded = e.forgottenLocked(id)
	}
	e.mu.Unlock()
	if recorded {
		return e.answerDecision(id, asked, got)
	}
	if g, applied, err := e.decideGuardEarly(owner, id, lease, d); err != nil || g == guardNoPart && d == base.DecisionAbort || g == guardApplied {
		return g.answer(asked, applied, err)
	}
	var checked time.Time
	if d == base.DecisionCommit && e.opts.LeaseChecker != nil {
		alive, at, err := e.checkDecideLease(ctx, owner.conn, lease) // slots, shared (txn_lease.go)
		checked = at
		if err != nil {
			return base.DecisionNone, fmt.Errorf("storenode: decide %v: lease %d: %w", id, lease, err)
		}
		if !alive {
			d = base.DecisionAbort
		}
	}
	e.mu.Lock()
	if d == base.DecisionCommit && !checked.IsZero() && e.opts.Now().Sub(checked) > e.opts.TxnAbortKeep/2 {
		// An abort a resolver recorded after the check could have been forgotten already.
		e.mu.Unlock()
		return base.DecisionNone, fmt.Errorf("%w: decide %v: the lease check is older than half of the abort keep time", ErrTxnBusy, id)
	}
	if asked == base.DecisionCommit && d == base.DecisionAbort && e.forgotLostLocked(id) {
		e.mu.Unlock()
		return base.DecisionNone, fmt.Errorf("%w: decide %v: the lease is gone, and forgotten decisions gave way since %v: it may be a commit forgotten, no abort recorded", ErrTxnBusy, id, e.opts.TxnAbortKeep)
	}
	if g, err := e.decideGuardLocked(owner, id, lease, &d); err != nil || g.ends() {
		e.mu.Unlock()
		return g.answer(asked, d, err)
	}
	rec, err := e.decideLocked(id, lease, d, count, !owner.any) // a session's Decide: bounded per owner
	e.mu.Unlock()
	if err != nil {
		return base.DecisionNone, err
	}
	return e.answerDecision(id, asked, rec)
}

// answerDecision answers a Decide of asked with the recorded rec once its record is durable.
func (e *Engine) answerDecision(id base.TxnID, asked base.Decision, rec txnDecision) (base.Decision, error) {
	if err := e.waitDurable(rec.lsn); err != nil {
		return base.DecisionNone, err
	}
	if rec.d != asked {
		return rec.d, fmt.Errorf("%w: transaction %v: %v asked, %v recorded", ErrTxnDecided, id, asked, rec.d)
	}
	return rec.d, nil
}

// decideLocked is the compare-and-set: it returns the recorded decision (a copy), logging d
// if none was. A recorded decision other than d is returned as is; the caller names it.
// A new decision of a Decide (quota) is refused past its owner's bound (txn_decisions.go).
// Caller holds mu.
func (e *Engine) decideLocked(id base.TxnID, lease int64, d base.Decision, count int, quota bool) (txnDecision, error) {
	if err := e.usable(); err != nil {
		return txnDecision{}, err
	}
	e.sweepTxnDecisions() // a replica's: none (the leader's resolver proposes it)
	if rec := e.txnDecisions[id]; rec != nil {
		if rec.d == d {
			e.learnCount(id, rec, count) // an abort recorded by a resolver learns the count
		}
		return *rec, nil
	}
	if f, ok := e.forgottenLocked(id); ok {
		return f, nil // decided and forgotten while the lease was checked
	}
	if len(e.txnDecisions) >= e.opts.MaxTxns {
		return txnDecision{}, fmt.Errorf("%w: %d decisions kept", ErrTxnBusy, len(e.txnDecisions))
	}
	owner := e.decisionOwner(id)
	if quota {
		if err := e.checkDecisionQuota(owner); err != nil {
			return txnDecision{}, err
		}
	}
	if e.replicated() {
		return e.decideProposed(id, lease, d, count) // txn_repl.go
	}
	e.scratch = appendTxnDecideRecord(e.scratch[:0], id, d, uint16(count), lease, 0)
	lsn, err := e.appendRecord(kindTxnDecide, e.scratch, true, noAck)
	if err != nil {
		return txnDecision{}, err
	}
	rec := e.applyDecide(id, d, uint16(count), lease, 0, lsn) // new: counted for owner, queued
	e.startResolver()
	return *rec, nil
}

// AskTxn answers a participant's resolver at this node, the primary: the recorded decision
// of id; or, when none is recorded and the LeaseChecker says the coordinator's lease is gone,
// abort, recorded first (the compare-and-set of DecideTxn, so a late commit fails); else
// DecisionNone (undecided: ask again later). The answer is given only once its record is
// synced. ctx bounds the lease check.
func (e *Engine) AskTxn(ctx context.Context, id base.TxnID, lease int64) (base.Decision, error) {
	e.mu.Lock()
	if err := e.usable(); err != nil {
		e.mu.Unlock()
		return base.DecisionNone, err
	}
	if err := e.checkLeader(); err != nil {
		e.mu.Unlock()
		return base.DecisionNone, err
	}
	rec := e.txnDecisions[id]
	var got txnDecision
	known := rec != nil
	if known {
		got = *rec
	} else {
		got, known = e.forgottenLocked(id)
	}
	e.mu.Unlock()
	if !known {
		if e.opts.LeaseChecker == nil {
			return base.DecisionNone, nil
		}
		alive, err := e.opts.LeaseChecker.LeaseAlive(ctx, lease)
		if err != nil {
			return base.DecisionNone, fmt.Errorf("storenode: resolve %v: lease %d: %w", id, lease, err)
		}
		if alive {
			return base.DecisionNone, nil
		}
		e.mu.Lock()
		got, err = e.decideLocked(id, lease, base.DecisionAbort, 0, false)
		e.mu.Unlock()
		if err != nil {
			return base.DecisionNone, err
		}
		e.stats.txnResolvedAborts.Add(1)
	}
	if err := e.waitDurable(got.lsn); err != nil {
		return base.DecisionNone, err
	}
	return got.d, nil
}

// ReportTxn records at this node, the primary, that participant index applied id's
// decision (logged and synced before it returns). A commit is forgotten once every
// participant reported; an unknown id (forgotten, or never decided here) is no error. A
// report already noted, or of an unknown id, returns only once every record logged so far
// is durable: the first report's record (or the one that forgot the commit) may still be
// on its way to the disk, and the participant forgets its part on this answer.
func (e *Engine) ReportTxn(id base.TxnID, index uint16) error {
	if index >= txnParticipantsMax {
		return fmt.Errorf("%w: report of participant %d", ErrMalformed, index)
	}
	e.mu.Lock()
	lsn, err := e.reportLocked(id, index)
	e.mu.Unlock()
	if err != nil || lsn == 0 {
		return err
	}
	return e.waitDurable(lsn)
}

func (e *Engine) reportLocked(id base.TxnID, index uint16) (uint64, error) {
	if err := e.usable(); err != nil {
		return 0, err
	}
	if err := e.checkLeader(); err != nil {
		return 0, err
	}
	rec := e.txnDecisions[id]
	if rec == nil || rec.reported&(1<<index) != 0 {
		return e.lastLSN, nil // the record that noted it (or forgot id) is at most this
	}
	if rec.count > 0 && index >= rec.count {
		return 0, fmt.Errorf("%w: transaction %v: report of participant %d of %d", ErrMalformed, id, index, rec.count)
	}
	if e.replicated() {
		return e.reportProposed(id, index) // txn_repl.go
	}
	e.scratch = appendTxnReportedRecord(e.scratch[:0], id, index)
	lsn, err := e.appendRecord(kindTxnReported, e.scratch, true, noAck)
	if err != nil {
		return 0, err
	}
	e.noteReported(id, rec, index)
	return lsn, nil
}

// noteReported sets a report and forgets a commit every participant applied. Caller holds mu.
func (e *Engine) noteReported(id base.TxnID, rec *txnDecision, index uint16) {
	was := rec.allReported()
	rec.reported |= 1 << index
	if rec.d == base.DecisionCommit && rec.allReported() {
		e.forgetDecision(id, rec)
	} else if !was && rec.allReported() {
		e.queueAbortDone(id, rec) // forgotten by the next sweep once durable
	}
}
