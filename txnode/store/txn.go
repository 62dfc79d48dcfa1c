package store

import (
	"context"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/storenode"
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
	PrepareTxn(ctx context.Context, p *TxnPrepare) (uint64, error)
	// DecideTxn records decision d of transaction id at the store, its primary (a
	// compare-and-set: storenode.Engine.DecideTxn) and returns the recorded decision; a
	// different one already recorded is an error matching storenode.ErrTxnDecided.
	DecideTxn(ctx context.Context, id base.TxnID, lease int64, d base.Decision, count int) (base.Decision, error)
	// ApplyTxn applies decision d to the store's prepared part of transaction id
	// (idempotent; an unknown id is no error).
	ApplyTxn(ctx context.Context, id base.TxnID, d base.Decision) error
}

// TxnPrepare is one participant's part of a transaction (storenode.TxnPrepare).
type TxnPrepare struct {
	Txn   base.TxnID
	Lease int64
	// Index is the participant's number, 0..63; Primary the primary's host:port (empty
	// when this store is the primary).
	Index   uint16
	Primary string
	Batch   *Batch
}

func (s *embedded) PrepareTxn(ctx context.Context, p *TxnPrepare) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	b := p.Batch
	lsn, err := s.e.PrepareTxn(&storenode.TxnPrepare{Txn: p.Txn, Lease: p.Lease, Primary: p.Primary, Index: p.Index,
		Batch: &storenode.Batch{Owner: b.Owner, Seq: b.Seq, Fences: b.Fences, Segments: b.Segments}})
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
