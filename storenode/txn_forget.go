package storenode

import (
	"fmt"

	"github.com/weftdb/weft/internal/assert"
)

// Bounded memory of the two-phase commit (txn.go): what a participant and a primary forget,
// and how replay accepts what the live engine wrote after forgetting something in memory.

// decisionMask is the reported bits that count for a decision of count participants: bits
// 0..count-1 (every bit for 64); none for count 0 (participants unknown).
func decisionMask(count uint16) uint64 {
	if count >= txnParticipantsMax {
		return ^uint64(0)
	}
	return uint64(1)<<count - 1
}

// learnCount gives an abort recorded without a participant count (a resolver's) the count a
// coordinator's Decide names, and drops the reports beyond it (no such participant: they
// were made up), so that no state is carried that the count contradicts. In memory only: a
// checkpoint carries it. Caller holds mu.
func (e *Engine) learnCount(rec *txnDecision, count int) {
	if rec.count != 0 || count <= 0 {
		return
	}
	rec.count = uint16(count)
	rec.reported &= decisionMask(rec.count)
}

// txnAppliedPerPrepared bounds the applied parts not yet reported (each waits for its
// primary to acknowledge a report) at this many times Options.MaxTxns: past it a prepare is
// refused (ErrTxnBusy), so parts applied under a primary that never answers cannot grow
// without bound. A restart's replay may rebuild more (reports whose forgot record was lost
// with the crash, a store of b3f6c9d, which wrote none); the resolver settles them.
const txnAppliedPerPrepared = 16

// txnPartsRoom refuses a prepare past Options.MaxTxns prepared parts (applied ones waiting
// to be reported do not count: they hold no rows and no batch), or past
// txnAppliedPerPrepared times that many applied ones. Caller holds mu.
func (e *Engine) txnPartsRoom() error {
	if e.txnPrepared >= e.opts.MaxTxns {
		return fmt.Errorf("%w: %d transactions prepared", ErrTxnBusy, e.txnPrepared)
	}
	if applied := len(e.txnParts) - e.txnPrepared; applied >= txnAppliedPerPrepared*e.opts.MaxTxns {
		return fmt.Errorf("%w: %d applied transactions wait to report to their primaries", ErrTxnBusy, applied)
	}
	return nil
}

// forgetReported forgets the parts of a resolver pass whose reports the primary
// acknowledged (done), in one hold of mu, and logs their ids in one forgot record, not
// forced (lost in a crash, the parts come back and are reported again). It returns how many
// it forgot. Called without mu.
func (e *Engine) forgetReported(tasks []txnTask) int {
	var ids []TxnID
	e.mu.Lock()
	for i := range tasks {
		t := &tasks[i]
		if p := e.txnParts[t.id]; t.done && p != nil && p.decision != DecisionNone {
			delete(e.txnParts, t.id)
			ids = append(ids, t.id)
		}
	}
	if len(ids) == 0 {
		e.mu.Unlock()
		return 0
	}
	assert.That(len(ids) <= txnForgotIDsMax, "storenode: forgot record bound")
	if e.usable() == nil {
		e.scratch = appendTxnForgotRecord(e.scratch[:0], ids)
		// An error fails the engine (appendRecord); the parts are forgotten in memory anyway,
		// as they were before this record: a replay reports them again.
		_, _ = e.appendRecord(kindTxnForgot, e.scratch, false, noAck)
	}
	settled := false
	if len(e.txnReplayed) > 0 {
		for _, id := range ids {
			delete(e.txnReplayed, id)
		}
		settled = len(e.txnReplayed) == 0
	}
	since := e.opts.Now().Sub(e.txnReplayedAt)
	e.mu.Unlock()
	if settled {
		e.opts.Logger.Info("storenode: the two-phase commit parts replay rebuilt are settled", "dir", e.dir, "after", since)
	}
	return len(ids)
}

// replayForgot drops a part a forgot record names: applied, reported, forgotten. Caller
// holds mu, in replay.
func (e *Engine) replayForgot(id TxnID) {
	if p := e.txnParts[id]; p != nil && p.decision != DecisionNone {
		delete(e.txnParts, id)
	}
}

// noteTxnReplayed logs, once at Open, what replay rebuilt of the two-phase commit, and
// remembers the parts to be settled (forgetReported logs when the last one is). Caller
// holds mu (or owns the engine, not shared yet).
func (e *Engine) noteTxnReplayed() {
	if !e.txnLive() {
		return
	}
	e.txnReplayed = make(map[TxnID]struct{}, len(e.txnParts))
	for id := range e.txnParts {
		e.txnReplayed[id] = struct{}{}
	}
	e.txnReplayedAt = e.opts.Now()
	e.opts.Logger.Info("storenode: replay rebuilt two-phase commit state", "dir", e.dir,
		"prepared", e.txnPrepared, "applied_unreported", len(e.txnParts)-e.txnPrepared,
		"decisions", len(e.txnDecisions), "forgotten_remembered", len(e.txnForgot))
}
