package txnode

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/txnode/store"
)

// unreachablePrepareStore never answers a prepare (every call fails as a broken connection
// would): the prepare's outcome stays unknown and its resend goes on until the DB closes.
type unreachablePrepareStore struct{ store.Store }

var errUnreachable = errors.New("test: storage node unreachable")

func (s *unreachablePrepareStore) PrepareTxn(ctx context.Context, p *base.TxnPrepare) (uint64, error) {
	return 0, errUnreachable
}

func (s *unreachablePrepareStore) DecideTxn(ctx context.Context, id base.TxnID, lease int64, d base.Decision, count int) (base.Decision, error) {
	return s.Store.(store.TxnStore).DecideTxn(ctx, id, lease, d, count)
}

func (s *unreachablePrepareStore) ApplyTxn(ctx context.Context, id base.TxnID, d base.Decision) error {
	return s.Store.(store.TxnStore).ApplyTxn(ctx, id, d)
}

// Close of a WriteBack DB while a prepare's answer is unknown (its resend still going): the
// flusher's epoch, held behind the prepare, must not keep Close waiting past its context.
func TestCloseWithPrepareUnansweredWriteBack(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := &unreachablePrepareStore{Store: newLocalStore(t, "")}
	db := openDB(t, ctx, Options{Store: s, CacheBytes: 1 << 20, Durability: WriteBack})
	tb := newTable(t, ctx, db, "t", 64)
	a := insertRow(t, ctx, tb, prepRow(1))
	b := insertRow(t, ctx, tb, prepRow(2))
	tx := openTx(t, ctx, db, true)
	require.NoError(t, tx.Put(tb, a, prepRow(100)))
	p, err := tx.prepare(txnInfo{ID: [16]byte{9}, Lease: 1})
	require.ErrorIs(t, err, ErrUnknownOutcome)
	require.NotNil(t, p)
	// A commit acknowledged meanwhile (WriteBack): dirty, its epoch held behind the prepare.
	require.NoError(t, db.Update(ctx, func(tx *Tx) error { return tx.Put(tb, b, prepRow(20)) }))
	closed := make(chan error, 1)
	go func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer ccancel()
		closed <- db.Close(cctx)
	}()
	select {
	case err := <-closed:
		require.Error(t, err, "the held epoch was never written: Close says so")
	case <-time.After(20 * time.Second):
		t.Fatal("Close hangs past its context: the flusher waits for the prepare's hold for ever")
	}
}
