package storenode

import (
	"fmt"
	"time"

	"github.com/weftdb/weft/base"
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
func (e *Engine) learnCount(id base.TxnID, rec *txnDecision, count int) {
	if rec.count != 0 || count <= 0 {
		return
	}
	if e.replicated() {
		e.proposeLearnCount(id, rec, count) // every replica learns it at the entry (txn_repl.go)
		return
	}
	e.setCount(id, rec, count)
}

// setCount is learnCount's change of rec. Caller holds mu.
func (e *Engine) setCount(id base.TxnID, rec *txnDecision, count int) {
	was := rec.allReported()
	rec.count = uint16(count)
	rec.reported &= decisionMask(rec.count)
	if !was && rec.allReported() {
		e.queueAbortDone(id, rec)
	}
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
	var ids []base.TxnID
	e.mu.Lock()
	for i := range tasks {
		t := &tasks[i]
		if p := e.txnParts[t.id]; t.done && p != nil && p.decision != base.DecisionNone {
			if !e.replicated() { // a replica forgets at the entry's apply
				e.applyForgot(t.id)
			}
			ids = append(ids, t.id)
		}
	}
	if len(ids) == 0 {
		e.mu.Unlock()
		return 0
	}
	assert.That(len(ids) <= txnForgotIDsMax, "storenode: forgot record bound")
	if e.replicated() {
		e.proposeForgot(ids) // txn_repl.go
		e.mu.Unlock()
		return len(ids)
	}
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

// noteTxnReplayed logs, once at Open, what replay rebuilt of the two-phase commit, and
// remembers the parts to be settled (forgetReported logs when the last one is). Caller
// holds mu (or owns the engine, not shared yet).
func (e *Engine) noteTxnReplayed() {
	if !e.txnLive() {
		return
	}
	e.txnReplayed = make(map[base.TxnID]struct{}, len(e.txnParts))
	for id := range e.txnParts {
		e.txnReplayed[id] = struct{}{}
	}
	e.txnReplayedAt = e.opts.Now()
	e.opts.Logger.Info("storenode: replay rebuilt two-phase commit state", "dir", e.dir,
		"prepared", e.txnPrepared, "applied_unreported", len(e.txnParts)-e.txnPrepared,
		"decisions", len(e.txnDecisions), "forgotten_remembered", len(e.txnForgot))
}

// txnAbortedEntry is one abort applied to a transaction not prepared here (txnAborted), in
// txnAbortedQ: it stands for txnAborted[id] while that is still at.
type txnAbortedEntry struct {
	id base.TxnID
	at time.Time
}

// expireAbortedUnprepared drops the aborts of unprepared transactions older than
// Options.TxnAbortKeep: the queue is oldest first, so it stops at the first young one.
// Caller holds mu.
func (e *Engine) expireAbortedUnprepared(now time.Time) {
	for len(e.txnAbortedQ) > 0 && now.Sub(e.txnAbortedQ[0].at) >= e.opts.TxnAbortKeep {
		e.popAbortedUnprepared()
	}
}

// popAbortedUnprepared drops the oldest entry of txnAbortedQ, and its abort unless noted
// again since (a prepare that found it expired may have dropped it already). Caller holds mu.
func (e *Engine) popAbortedUnprepared() {
	q := e.txnAbortedQ[0]
	if at, ok := e.txnAborted[q.id]; ok && at.Equal(q.at) {
		delete(e.txnAborted, q.id)
	}
	e.txnVisited++
	e.txnAbortedQ[0] = txnAbortedEntry{}
	e.txnAbortedQ = e.txnAbortedQ[1:]
	if len(e.txnAbortedQ) == 0 {
		e.txnAbortedQ = nil
	}
}

// txnAbortEntry is one abort decision in txnAbortQ or txnAbortDoneQ: it stands for
// txnDecisions[id] while that is still rec (a decision forgotten, or replaced in replay,
// leaves its entries to be dropped when met); lsn is what must be durable before the
// decision is forgotten (txnAbortDoneQ: the last record when every participant reported).
type txnAbortEntry struct {
	id  base.TxnID
	rec *txnDecision
	lsn uint64
}

// queueAbort queues a new abort decision for the sweep past Options.TxnAbortKeep (the
// decisions are recorded in the order of their at, the engine clock). The entries of
// aborts forgotten sooner (every participant reported) wait behind younger ones: at twice
// the live decisions' bound (Options.MaxTxns) the queue drops them, keeping the live ones,
// so each entry costs O(1) amortized. Caller holds mu.
func (e *Engine) queueAbort(id base.TxnID, rec *txnDecision) {
	if rec.d != base.DecisionAbort {
		return
	}
	if len(e.txnAbortQ) >= 2*max(e.opts.MaxTxns, len(e.txnDecisions)) {
		live := e.txnAbortQ[:0]
		for _, q := range e.txnAbortQ {
			if e.txnDecisions[q.id] == q.rec {
				live = append(live, q)
			}
		}
		e.txnVisited += uint64(len(e.txnAbortQ))
		clear(e.txnAbortQ[len(live):])
		e.txnAbortQ = live
	}
	e.txnAbortQ = append(e.txnAbortQ, txnAbortEntry{id: id, rec: rec})
	if rec.allReported() {
		e.queueAbortDone(id, rec)
	}
}

// queueAbortDone queues an abort every participant reported, to be forgotten by the next
// sweep once every record logged so far is durable. Caller holds mu.
func (e *Engine) queueAbortDone(id base.TxnID, rec *txnDecision) {
	if rec.d != base.DecisionAbort {
		return
	}
	e.txnAbortDoneQ = append(e.txnAbortDoneQ, txnAbortEntry{id: id, rec: rec, lsn: max(rec.lsn, e.lastLSN)})
}

// txnForgotten is a decision forgotten by this node, its primary (Engine.txnForgot).
type txnForgotten struct {
	d   base.Decision
	at  time.Time // engine clock, when forgotten
	seq uint64    // its txnForgotQ entry's
}

// txnForgotEntry is one forgotten decision in the order forgotten.
type txnForgotEntry struct {
	id  base.TxnID
	seq uint64
}

// forgetDecision forgets a decision every participant reported (or an abort past
// Options.TxnAbortKeep) and remembers it in txnForgot, Options.TxnAbortKeep at most (the
// oldest give way past Options.TxnForgetMax): the coordinator's resend of a Decide whose answer
// it lost, after every participant's resolver learned the decision and reported, is
// answered with it, instead of recording abort (the lease gone: a committed transaction
// reported aborted) or a second commit nobody reports (a leak toward MaxTxns); an Ask is
// answered with it too. A coordinator that lost its answer for longer than TxnAbortKeep
// cannot trust an abort (docs/cluster.md, "What the coordinator must do"). Caller holds mu.
func (e *Engine) forgetDecision(id base.TxnID, rec *txnDecision) {
	delete(e.txnDecisions, id)
	e.countDecision(rec, 0)
	now := e.opts.Now()
	e.expireForgotten(now)
	if len(e.txnForgotQ) >= e.opts.TxnForgetMax {
		if q := e.txnForgotQ[0]; e.txnForgot[q.id].seq == q.seq {
			e.txnForgotLost = now // a young one gives way (the expired ones went above)
		}
		e.popForgotten()
	}
	e.rememberForgotten(id, rec.d, now)
}

// rememberForgotten appends decision d of id, forgotten at at, to the forgotten decisions
// remembered, newest last (forgetDecision; a replica's Open from its sidecar). Caller holds mu.
func (e *Engine) rememberForgotten(id base.TxnID, d base.Decision, at time.Time) {
	e.txnForgotSeq++
	e.txnForgot[id] = txnForgotten{d: d, at: at, seq: e.txnForgotSeq}
	e.txnForgotQ = append(e.txnForgotQ, txnForgotEntry{id: id, seq: e.txnForgotSeq})
}

// forgottenLocked returns the forgotten decision of id, as a record already durable, if
// remembered and younger than Options.TxnAbortKeep. Caller holds mu.
func (e *Engine) forgottenLocked(id base.TxnID) (txnDecision, bool) {
	f, ok := e.txnForgot[id]
	if !ok {
		return txnDecision{}, false
	}
	if e.opts.Now().Sub(f.at) >= e.opts.TxnAbortKeep {
		return txnDecision{}, false
	}
	return txnDecision{d: f.d, at: f.at}, true
}

// forgotLostLocked reports whether id is neither decided nor remembered forgotten here
// while a forgotten decision gave way less than Options.TxnAbortKeep ago (txnForgotLost):
// id may be one of them. Caller holds mu.
func (e *Engine) forgotLostLocked(id base.TxnID) bool {
	if e.txnForgotLost.IsZero() || e.opts.Now().Sub(e.txnForgotLost) >= e.opts.TxnAbortKeep || e.txnDecisions[id] != nil {
		return false
	}
	_, ok := e.forgottenLocked(id)
	return !ok
}

// expireForgotten drops the forgotten decisions older than Options.TxnAbortKeep. A replica
// drops none by age (only TxnForgetMax bounds them): which decisions it remembers is then
// decided by the log alone, alike on every replica; their age is the leader's check at its
// answer (forgottenLocked). Caller holds mu.
func (e *Engine) expireForgotten(now time.Time) {
	if e.replicated() {
		return
	}
	for len(e.txnForgotQ) > 0 {
		f := e.txnForgot[e.txnForgotQ[0].id]
		if f.seq == e.txnForgotQ[0].seq && now.Sub(f.at) < e.opts.TxnAbortKeep {
			return
		}
		e.popForgotten()
	}
}

// popForgotten drops the oldest forgotten decision. Caller holds mu.
func (e *Engine) popForgotten() {
	q := e.txnForgotQ[0]
	if f, ok := e.txnForgot[q.id]; ok && f.seq == q.seq {
		delete(e.txnForgot, q.id)
	}
	e.txnForgotQ[0] = txnForgotEntry{}
	e.txnForgotQ = e.txnForgotQ[1:]
	if len(e.txnForgotQ) == 0 {
		e.txnForgotQ = nil
	}
}

// sweepTxnDecisions forgets the aborts every participant reported or older than
// Options.TxnAbortKeep, and drops the forgotten decisions past it. Caller holds mu. A forgotten abort is answered abort again by
// AskTxn (the lease is gone) and refuses a late commit (DecideTxn checks the lease first).
func (e *Engine) sweepTxnDecisions() {
	if e.replicated() {
		return // the leader proposes a replica's sweep (proposeTxnExpiry, txn_repl.go)
	}
	now := e.opts.Now()
	e.expireForgotten(now)
	// Both queues in the order their entries came (txn_forget.go): O(1) amortized, no scan
	// of the decisions under mu.
	durable := e.durableThrough()
	for len(e.txnAbortDoneQ) > 0 {
		q := e.txnAbortDoneQ[0]
		if rec := e.txnDecisions[q.id]; rec == q.rec && rec != nil {
			if q.lsn > durable {
				break
			}
			e.forgetDecision(q.id, rec)
		}
		e.txnVisited++
		e.txnAbortDoneQ[0] = txnAbortEntry{}
		e.txnAbortDoneQ = e.txnAbortDoneQ[1:]
	}
	for len(e.txnAbortQ) > 0 {
		q := e.txnAbortQ[0]
		if rec := e.txnDecisions[q.id]; rec == q.rec && rec != nil {
			if now.Sub(rec.at) < e.opts.TxnAbortKeep || rec.lsn > durable {
				break
			}
			e.forgetDecision(q.id, rec)
		}
		e.txnVisited++
		e.txnAbortQ[0] = txnAbortEntry{}
		e.txnAbortQ = e.txnAbortQ[1:]
	}
}
