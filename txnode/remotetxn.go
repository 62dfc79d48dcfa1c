package txnode

import (
	"context"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/sgio"
)

// The remote store's two-phase commit calls (store.TxnStore). Each is retried on a new
// connection when the connection broke: a prepare sent again is deduplicated by its seq (the
// same bytes answer its LSN), a decision sent again is the same compare-and-set, an apply is
// idempotent.

func (s *remoteStore) PrepareTxn(ctx context.Context, p *base.TxnPrepare) (uint64, error) {
	b := p.Batch
	m := &sgio.TxnPrepare{Txn: p.Txn, Lease: p.Lease, Index: p.Index, Primary: p.Primary,
		Commit: sgio.Commit{Owner: b.Owner, Seq: b.Seq, Fences: b.Fences, Segments: b.Segments}}
	var ack sgio.CommitAck
	err := s.call(ctx, m, &ack, true)
	return ack.LSN, err
}

func (s *remoteStore) DecideTxn(ctx context.Context, id base.TxnID, lease int64, d base.Decision, count int) (base.Decision, error) {
	var st sgio.TxnState
	err := s.call(ctx, &sgio.TxnDecide{Txn: id, Lease: lease, Decision: uint8(d), Count: uint16(count)}, &st, true)
	return base.Decision(st.Decision), err
}

func (s *remoteStore) ApplyTxn(ctx context.Context, id base.TxnID, d base.Decision) error {
	return s.call(ctx, &sgio.TxnApply{Txn: id, Decision: uint8(d)}, &sgio.OK{}, true)
}
