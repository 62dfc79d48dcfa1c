package storenode

import (
	"context"
	"errors"
	"fmt"

	"github.com/weftdb/weft/base"
)

// The primary's guard on decisions (docs/cluster.md, "Two-phase commit"): a decision is
// recorded only for a transaction whose prepared part this node holds as its primary, so
// that Decides of made-up ids cannot fill the decisions table (bounded by Options.MaxTxns)
// and refuse every real coordinator's.
//
// Invariants, under mu:
//   - a commit is recorded only when the part is prepared here with an empty primary (this
//     node is the primary), by the deciding owner (DecideTxnAs) under the deciding lease; a
//     part applied commit already answers with its decision, and nothing is recorded;
//   - an abort of an id this node holds no part of (as primary) is answered abort with no
//     record (remembered in memory as an abort applied, so that its prepare, if still on its
//     way, is refused): the coordinator applies it to every participant itself, and a
//     participant's resolver learns it once the lease is gone;
//   - a decision recorded or forgotten is answered as before (a resent Decide of a commit
//     forgotten, its part gone, still learns its outcome);
//   - a Decide ended by the guard costs no lease check.

// errTxnNoPart is ErrTxnNotPrepared for an id of which no part is held here as primary.
var errTxnNoPart = newSentinel("storenode: no part of the transaction is prepared here, its primary", ErrTxnNotPrepared)

// decider is who sends a Decide: an owner (checked against the part's), or any (the
// embedded engine's caller).
type decider struct {
	owner uint64
	any   bool
	conn  uint64 // the session's connection (its lease checks' slots, txn_lease.go); 0: the engine's caller
}

// DecideTxnAs is DecideTxn from owner, a storage node's session on connection conn: a
// prepared part of another owner, or under another lease, is refused with ErrTxnNotPrepared,
// commit and abort alike. The lease check takes one of conn's verification slots
// (txn_lease.go): none free, the Decide is refused at once with ErrTxnBusy.
func (e *Engine) DecideTxnAs(ctx context.Context, owner uint64, id base.TxnID, lease int64, d base.Decision, count int, conn uint64) (base.Decision, error) {
	return e.decideTxn(ctx, decider{owner: owner, conn: conn}, id, lease, d, count)
}

// txnGuard is what decideGuard found of a transaction at its primary.
type txnGuard uint8

const (
	guardGo      txnGuard = iota // go on to record (or find recorded) the decision
	guardNoPart                  // no part held as primary, and abort is the answer: no record
	guardApplied                 // the part here is applied commit: the answer, no record
)

// ends reports whether the guard answers the Decide itself, without a record.
func (g txnGuard) ends() bool { return g == guardNoPart || g == guardApplied }

// answer is a Decide's answer when the guard ends it: err; or (guardNoPart) abort, or
// (guardApplied) the applied decision applied, with an error matching ErrTxnDecided when
// another was asked.
func (g txnGuard) answer(asked, applied base.Decision, err error) (base.Decision, error) {
	switch {
	case err != nil:
		return base.DecisionNone, err
	case g == guardApplied && applied != asked:
		return applied, fmt.Errorf("%w: %v asked, %v applied here", ErrTxnDecided, asked, applied)
	case g == guardApplied:
		return applied, nil
	case asked == base.DecisionCommit:
		return base.DecisionAbort, fmt.Errorf("%w: abort: the lease is gone and no part is prepared here", ErrTxnDecided)
	}
	return base.DecisionAbort, nil
}

// decideGuardEarly runs the guard before the lease check (decideGuardLocked, without
// changing d): an abort of no part, a stranger's Decide and a commit of no part end here,
// without asking etcd (a flood of made-up ids costs no lease check). A commit of no part is
// ErrTxnNotPrepared (it matches ErrTxnDecided: the coordinator of a commit decided and
// forgotten past the keep, whose answer it lost, reports the outcome unknown), or
// ErrTxnBusy while forgotten decisions gave way (it may be the resend of one of them,
// which the coordinator would report aborted).
func (e *Engine) decideGuardEarly(owner decider, id base.TxnID, lease int64, d base.Decision) (txnGuard, base.Decision, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	g, err := e.decideGuardLocked(owner, id, lease, &d)
	if errors.Is(err, errTxnNoPart) && e.forgotLostLocked(id) {
		return guardGo, d, fmt.Errorf("%w: decide %v: no part here, and forgotten decisions gave way since %v: it may be a commit forgotten",
			ErrTxnBusy, id, e.opts.TxnAbortKeep)
	}
	return g, d, err
}

// decideGuardLocked checks a Decide of d against the part held (see the file doc), turning
// d into the decision a part already applied took. Caller holds mu.
func (e *Engine) decideGuardLocked(owner decider, id base.TxnID, lease int64, d *base.Decision) (txnGuard, error) {
	if e.txnDecisions[id] != nil {
		return guardGo, nil // decideLocked answers with it
	}
	if _, ok := e.forgottenLocked(id); ok {
		return guardGo, nil
	}
	p := e.txnParts[id]
	if p == nil || p.primary != "" {
		if *d == base.DecisionAbort {
			if p == nil {
				e.noteAbortedUnprepared(id) // its prepare, still on its way, is refused
			}
			return guardNoPart, nil
		}
		return guardGo, fmt.Errorf("%w: transaction %v", errTxnNoPart, id)
	}
	if p.decision != base.DecisionNone {
		// Applied here already (kept decisions are answered above): that is the decision.
		// An abort is recorded as any abort (a resolver's Ask is then answered at once); a
		// commit, whose decision was recorded and forgotten, is answered without a record (one
		// recorded now would have no count: a record replay refuses).
		*d = p.decision
		if p.decision == base.DecisionCommit {
			return guardApplied, nil
		}
		return guardGo, nil
	}
	if !owner.any && p.batch.Owner != owner.owner || p.lease != lease {
		return guardGo, fmt.Errorf("%w: transaction %v is prepared here by another owner or under another lease", ErrTxnNotPrepared, id)
	}
	return guardGo, nil
}
