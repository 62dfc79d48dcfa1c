package storenode

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/weftdb/weft/base"
)

// Transactions in doubt (issue 22, defect 7; docs/operations.md, "Transactions in doubt"): a
// part prepared and never decided (its coordinator gone, its primary unreachable or lost)
// keeps its rows locked, and its table can be neither acquired by another owner nor dropped.
// Once it has been prepared for Options.TxnInDoubtAfter (engine clock; replay restarts the
// count: the prepare record holds no time), it is in doubt: TxnsInDoubt lists it, and
// AbortInDoubt, an operator's request, aborts it.
//
// Invariants:
//   - only a part prepared (not applied) for at least TxnInDoubtAfter is aborted;
//   - at its primary (this node), abort is recorded first, the compare-and-set of DecideTxn:
//     a commit recorded is never overridden (the resolver applies it);
//   - elsewhere the abort is the operator's decision: if the primary recorded commit and
//     other participants applied it, aborting this part breaks the transaction's atomicity
//     (use it when the primary is lost; its resolver is asked first by the CLI's listing,
//     which shows the primary).

// TxnInDoubt is a prepared part in doubt, as TxnsInDoubt lists it.
type TxnInDoubt struct {
	ID      base.TxnID
	Owner   uint64 // the owner that prepared it
	Lease   int64  // the coordinator's lease
	Table   uint32 // the first table it writes
	Age     time.Duration
	Primary string // the primary's host:port; empty: this node
	// Decision is, for a decision this node keeps as primary (not a part), the decision:
	// kept for TxnInDoubtAfter, some participant not reported (txn_decisions.go). Owner is
	// then its part's owner (0: unknown), Table 0, Primary empty. AbortInDoubt refuses it:
	// a commit is never forgotten here (a participant may still ask for it).
	Decision base.Decision
}

// txnInDoubtLocked returns p as in doubt at now, or false. Caller holds mu.
func (e *Engine) txnInDoubtLocked(p *txnPart, now time.Time) (TxnInDoubt, bool) {
	age := now.Sub(p.at)
	if p.decision != base.DecisionNone || age < e.opts.TxnInDoubtAfter {
		return TxnInDoubt{}, false
	}
	d := TxnInDoubt{ID: p.id, Owner: p.batch.Owner, Lease: p.lease, Age: age, Primary: p.primary}
	if len(p.batch.Segments) > 0 {
		d.Table = p.batch.Segments[0].Table
	}
	return d, true
}

// TxnsInDoubt lists the parts prepared here for at least Options.TxnInDoubtAfter, and the
// decisions kept here that long waiting for a participant's report (TxnInDoubt.Decision),
// the oldest first, at most max of them (max <= 0: all, at most 2 x Options.MaxTxns), and
// how many there are. Any goroutine may call it; the slice is the caller's.
func (e *Engine) TxnsInDoubt(max int) ([]TxnInDoubt, int) {
	e.mu.Lock()
	now := e.opts.Now()
	var out []TxnInDoubt
	for _, p := range e.txnParts {
		if d, ok := e.txnInDoubtLocked(p, now); ok {
			out = append(out, d)
		}
	}
	for id, d := range e.txnDecisions {
		if age := now.Sub(d.at); age >= e.opts.TxnInDoubtAfter && !d.allReported() {
			out = append(out, TxnInDoubt{ID: id, Owner: d.owner, Lease: d.lease, Age: age, Decision: d.d})
		}
	}
	e.mu.Unlock()
	slices.SortFunc(out, func(a, b TxnInDoubt) int {
		if c := cmp.Compare(b.Age, a.Age); c != 0 {
			return c // older first
		}
		return slices.Compare(a.ID[:], b.ID[:])
	})
	n := len(out)
	if max > 0 && len(out) > max {
		out = out[:max]
	}
	return out, n
}

// txnInDoubtCount counts the parts in doubt (the txn_in_doubt gauge). Caller holds mu.
func (e *Engine) txnInDoubtCount() int {
	now := e.opts.Now()
	n := 0
	for _, p := range e.txnParts {
		if p.decision == base.DecisionNone && now.Sub(p.at) >= e.opts.TxnInDoubtAfter {
			n++
		}
	}
	return n
}

// AbortInDoubt aborts the part of transaction id, in doubt here (see the file doc): at its
// primary, abort is recorded first (ErrTxnDecided when commit is recorded); the part is then
// applied abort, its rows unlocked, and reported to its primary by the resolver. A part not
// prepared here, or prepared for less than Options.TxnInDoubtAfter, is refused with
// ErrTxnNotInDoubt. It returns what it aborted, once the records are synced.
func (e *Engine) AbortInDoubt(id base.TxnID) (TxnInDoubt, error) {
	e.mu.Lock()
	if err := e.usable(); err != nil {
		e.mu.Unlock()
		return TxnInDoubt{}, err
	}
	p := e.txnParts[id]
	if p == nil {
		e.mu.Unlock()
		return TxnInDoubt{}, fmt.Errorf("%w: transaction %v is not prepared here", ErrTxnNotInDoubt, id)
	}
	d, ok := e.txnInDoubtLocked(p, e.opts.Now())
	if !ok {
		e.mu.Unlock()
		return TxnInDoubt{}, fmt.Errorf("%w: transaction %v: %v here, prepared %v ago (in doubt after %v)", ErrTxnNotInDoubt, id,
			p.decision, e.opts.Now().Sub(p.at).Round(time.Millisecond), e.opts.TxnInDoubtAfter)
	}
	var lsn uint64
	if p.primary == "" {
		rec, err := e.decideLocked(id, p.lease, base.DecisionAbort, 0, false)
		if err != nil {
			e.mu.Unlock()
			return TxnInDoubt{}, err
		}
		if rec.d != base.DecisionAbort {
			e.mu.Unlock()
			return TxnInDoubt{}, fmt.Errorf("%w: transaction %v: %v recorded here, its primary: the resolver applies it", ErrTxnDecided, id, rec.d)
		}
		lsn = rec.lsn
	}
	e.mu.Unlock()
	if err := e.waitDurable(lsn); err != nil {
		return TxnInDoubt{}, err
	}
	if err := e.ApplyTxn(id, base.DecisionAbort); err != nil {
		return TxnInDoubt{}, err
	}
	e.opts.Logger.Warn("storenode: transaction in doubt aborted by an operator", "txn", id.String(), "owner", d.Owner,
		"table", d.Table, "primary", d.Primary, "age", d.Age)
	return d, nil
}
