package txncoord

import (
	"context"

	"github.com/weftdb/weft/txnode"
	"github.com/weftdb/weft/txnode/internal/coordbridge"
)

// TxnInfo names a transaction of a two-phase commit and this part in it.
type TxnInfo struct {
	// ID is unique in the cluster (the coordinator's lease id and a counter).
	ID [16]byte
	// Lease is the coordinator's etcd lease id: once it is gone, resolvers may record abort.
	Lease int64
	// Index is this part's participant number, 0..63 (the Decide's count is their number).
	Index uint16
	// Primary is the host:port of the primary storage node; empty when this part's storage
	// node is the primary.
	Primary string
}

// Prepared is a transaction prepared at its node's storage node: its rows are locked in the
// cache until Apply (or Abandon). Its methods are for one goroutine at a time (the
// coordinator's), which may hand it to another.
type Prepared struct {
	part coordbridge.Part[txnode.Tx]
}

// Prepare validates tx as Commit would and prepares it at the storage node as part
// info.Index of transaction info.ID, keeping its rows locked in the node's cache. The
// transaction must have written something (a part that only read is checked with Validate).
// It returns:
//   - (p, nil): prepared; decide, then p.Apply the decision.
//   - (nil, err): not prepared, the rows unlocked, the Tx finished: txnode.ErrConflict (a
//     read changed, or a row to write is locked by another transaction committing or
//     prepared here: retry the whole transaction), the storage node's refusal
//     (txnode.ErrTxnLocked, txnode.ErrFenced, ...), a lease or grant error.
//   - (p, err wrapping txnode.ErrUnknownOutcome): the prepare may have landed; abort it
//     (p.Apply of DecisionAbort), never commit.
//
// The Tx must come from DB.Begin. It is finished either way (its methods return
// txnode.ErrTxDone, Rollback is a no-op); p holds it.
func Prepare(tx *txnode.Tx, info TxnInfo) (*Prepared, error) {
	ts, err := fn.PrepareLock(tx)
	if err != nil {
		return nil, err
	}
	p := new(Prepared)
	held, err := fn.PrepareSend(tx, ts, coordbridge.TxnInfo(info), &p.part)
	if !held {
		return nil, err
	}
	return p, err
}

// Validate checks again that everything the prepared transaction read is unchanged (its own
// rows stay locked): a coordinator validates every part once all are prepared, so the reads
// of all its parts hold at one moment, while every write of the transaction is locked
// (serializable across storage nodes). txnode.ErrConflict when a read changed; the lease or
// grant error of a table no longer served.
func (p *Prepared) Validate() error { return fn.PartValidate(&p.part) }

// Info returns the transaction and part the Prepared was prepared as.
func (p *Prepared) Info() TxnInfo { return TxnInfo(p.part.Info) }

// Apply sends decision d to this part's storage node, retried until it answers or ctx ends,
// then finishes the part here: commit installs the rows (a new commit version) and unlocks
// them, abort unlocks them with their old values. Call it only with the decision recorded
// at the primary (or abort for a part whose prepare failed). If ctx ends first, the rows stay
// locked and the error wraps ctx's: call Apply again (or Abandon); the storage node's
// resolver finishes the part on its own meanwhile. If the storage node applied the other
// decision (txnode.ErrTxnDecided: a resolver's), the part is finished with that one here too
// and the error says so.
func (p *Prepared) Apply(ctx context.Context, d Decision) error {
	return fn.PartApply(&p.part, ctx, d)
}

// ApplyUncertain is Apply(abort) for a coordinator that cannot tell whether the transaction
// committed (the primary answered abort after the coordinator's commit decision went
// unanswered for longer than the primary remembers forgotten decisions): it sends abort to
// this part's storage node, retried until it answers or ctx ends (the same errors as Apply),
// then drops the part's rows from the cache instead of unlocking their old values, so their
// next read fetches what the storage node holds (committed or not). It returns
// DecisionCommit when the storage node says it applied commit (txnode.ErrTxnDecided), else
// DecisionNone (the storage node settled the part: aborted it, or applied and forgot it).
// Any goroutine may call it, one at a time per Prepared.
func (p *Prepared) ApplyUncertain(ctx context.Context) (Decision, error) {
	return fn.PartApplyUncertain(&p.part, ctx)
}

// Abandon gives the part up without knowing its decision: its rows are unlocked and dropped
// from the cache (their next read fetches what the storage node holds, which its resolver
// settles). For a coordinator that cannot learn the decision before its DB closes; a local
// commit of such a row before the storage node settled it fails the node's commit pipeline
// (txnode.ErrTxnLocked), so only call it when the DB is closing.
func (p *Prepared) Abandon() { fn.PartAbandon(&p.part) }
