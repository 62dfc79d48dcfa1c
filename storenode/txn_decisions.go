package storenode

import (
	"fmt"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/assert"
)

// Per-owner bounds on kept decisions (issue 22's hostile review, defect 6). A commit is kept
// until every participant reported, and carried by every checkpoint: a client that decides
// its own part's commit naming 63 participants that do not exist keeps it for ever, and
// MaxTxns of them refused every coordinator's Decide. A commit decision cannot be forgotten
// safely (a participant that never reported may still ask for it), so:
//
//   - a kept decision counts against the owner of the primary's prepared part it was
//     recorded for (txnDecision.owner; after a restart, the owner of the part replayed, or
//     unknown: not counted); a session's Decide (DecideTxnAs) of a new decision past
//     Options.MaxTxnsPerOwner of its owner's is refused with ErrTxnBusy, for that owner only
//     (the resolver's and the operator's aborts, and the embedded engine's trusted caller,
//     DecideTxn, are never refused by it);
//   - a decision kept for Options.TxnInDoubtAfter, some participant not reported, is
//     listed by TxnsInDoubt (txn_doubt.go) for an operator to see.
//
// Invariant, under mu: txnDecisionOwners[o] is the number of kept decisions of owner o; no
// entry for none.

// decisionOwner returns the owner of id's part prepared here as its primary, or 0. Caller
// holds mu.
func (e *Engine) decisionOwner(id base.TxnID) uint64 {
	if p := e.txnParts[id]; p != nil && p.primary == "" && p.decision == base.DecisionNone {
		return p.batch.Owner
	}
	return 0
}

// checkDecisionQuota refuses a new decision of owner past its bound. Caller holds mu.
func (e *Engine) checkDecisionQuota(owner uint64) error {
	if n := e.txnDecisionOwners[owner]; owner != 0 && n >= e.opts.MaxTxnsPerOwner {
		return fmt.Errorf("%w: owner %d has %d decisions kept here, waiting for their participants' reports (MaxTxnsPerOwner)",
			ErrTxnBusy, owner, n)
	}
	return nil
}

// countDecision makes owner (0: none) the owner rec counts against. Caller holds mu.
func (e *Engine) countDecision(rec *txnDecision, owner uint64) {
	if o := rec.owner; o != 0 {
		n := e.txnDecisionOwners[o] - 1
		assert.That(n >= 0, "storenode: decisions of an owner below zero")
		if n == 0 {
			delete(e.txnDecisionOwners, o)
		} else {
			e.txnDecisionOwners[o] = n
		}
	}
	rec.owner = owner
	if owner != 0 {
		e.txnDecisionOwners[owner]++
	}
}
