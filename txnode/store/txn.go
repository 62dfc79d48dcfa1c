package store

import (
	"context"

	"github.com/weftdb/weft/base"
)

// TxnStore is the two-phase commit side of a Store (docs/cluster.md, "Two-phase commit"):
// what a transaction node needs to be one participant of a transaction a coordinator runs
// over several storage nodes, and to record its decision when its store is the primary. The
// embedded store and txnode's remote store implement it. Errors are the storage node's
// sentinels (storenode.ErrTxnLocked, ErrTxnDecided, ErrTxnBusy, ErrFenced, ...), matched by
// errors.Is for the embedded engine and across TCP alike. Any goroutine may call the methods
// (never a connection's receiver); each honours its context.
type TxnStore interface {
	// PrepareTxn makes p's batch durable as prepared at the store (checked as a Commit: the
	// seq window, then fences; refused with ErrTxnLocked, ErrTxnDecided or ErrTxnBusy) and
	// returns the prepare record's LSN. The batch is not kept once it returns. A refused
	// prepare does not take its seq.
	PrepareTxn(ctx context.Context, p *base.TxnPrepare) (uint64, error)
	// DecideTxn records decision d of transaction id at the store, its primary (a
	// compare-and-set: storenode.Engine.DecideTxn) and returns the recorded decision; a
	// different one already recorded is an error matching storenode.ErrTxnDecided.
	DecideTxn(ctx context.Context, id base.TxnID, lease int64, d base.Decision, count int) (base.Decision, error)
	// ApplyTxn applies decision d to the store's prepared part of transaction id
	// (idempotent; an unknown id is no error).
	ApplyTxn(ctx context.Context, id base.TxnID, d base.Decision) error
}

func (s *embedded) PrepareTxn(ctx context.Context, p *base.TxnPrepare) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	lsn, err := s.e.PrepareTxn(p) // the engine keeps a copy of its own (its prepare record)
	return lsn, closedErr(err)
}

func (s *embedded) DecideTxn(ctx context.Context, id base.TxnID, lease int64, d base.Decision, count int) (base.Decision, error) {
	got, err := s.e.DecideTxn(ctx, id, lease, d, count)
	return got, closedErr(err)
}

func (s *embedded) ApplyTxn(ctx context.Context, id base.TxnID, d base.Decision) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return closedErr(s.e.ApplyTxn(id, d))
}
