package txnode

import (
	"context"
	"encoding/binary"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/txnode/store"
)

func prepRow(v uint64) []byte {
	b := make([]byte, 64)
	binary.LittleEndian.PutUint64(b, v)
	return b
}

// A prepared transaction's rows stay locked in the owner's own cache until its decision is
// applied: a local read or write of one waits (bounded by its context) and never sees the
// prepared bytes; commit then installs them, abort leaves the old ones; a local transaction
// that wants to prepare a locked row conflicts; ordinary commits go on before, between and
// after (the prepare's seq is in the owner's seq order).
func TestPreparedRowsLockedInCache(t *testing.T) {
	eachConfig(t, openConfigs(t), Options{CacheBytes: 1 << 20}, func(t *testing.T, db *DB) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		tb := newTable(t, ctx, db, "t", 64)
		a := insertRow(t, ctx, tb, prepRow(1))
		b := insertRow(t, ctx, tb, prepRow(2))
		other := insertRow(t, ctx, tb, prepRow(3))

		id := [16]byte{1, 2, 3}
		tx := openTx(t, ctx, db, true)
		require.NoError(t, tx.Put(tb, a, prepRow(100)))
		require.NoError(t, tx.Put(tb, b, prepRow(200)))
		p, err := tx.prepare(txnInfo{ID: id, Lease: 1})
		require.NoError(t, err)
		require.ErrorIs(t, tx.Put(tb, a, prepRow(5)), ErrTxDone)

		// A reader of a prepared row waits; with its context ended it fails, never
		// returning the prepared (or any) bytes.
		dst := make([]byte, 64)
		short, scancel := context.WithTimeout(ctx, 20*time.Millisecond)
		err = tb.Get(short, a, dst)
		scancel()
		require.ErrorIs(t, err, context.DeadlineExceeded)
		short, scancel = context.WithTimeout(ctx, 20*time.Millisecond)
		err = db.Update(short, func(tx *Tx) error { return tx.Put(tb, b, prepRow(7)) })
		scancel()
		require.ErrorIs(t, err, context.DeadlineExceeded)
		// A waiter started now gets the committed value once the decision is applied.
		got := make(chan uint64, 1)
		go func() {
			d := make([]byte, 64)
			if err := tb.Get(ctx, a, d); err != nil {
				got <- 0
				return
			}
			got <- binary.LittleEndian.Uint64(d)
		}()
		// Rows not prepared commit meanwhile, and another transaction prepares and
		// aborts on them.
		tx2 := openTx(t, ctx, db, true)
		require.NoError(t, tx2.Put(tb, other, prepRow(30)))
		require.NoError(t, tx2.Commit(), "rows not prepared commit meanwhile")
		tx2 = openTx(t, ctx, db, true)
		require.NoError(t, tx2.Put(tb, other, prepRow(31)))
		p2, err := tx2.prepare(txnInfo{ID: [16]byte{9}, Lease: 1})
		require.NoError(t, err)
		require.NoError(t, db.decideTxn(ctx, [16]byte{9}, 1, base.DecisionAbort, 1))
		require.NoError(t, p2.apply(ctx, base.DecisionAbort))
		require.NoError(t, tb.Get(ctx, other, dst))
		require.Equal(t, uint64(30), binary.LittleEndian.Uint64(dst), "abort leaves the old value")

		require.NoError(t, db.decideTxn(ctx, id, 1, base.DecisionCommit, 1))
		require.NoError(t, db.decideTxn(ctx, id, 1, base.DecisionCommit, 1), "the same decision again")
		require.ErrorIs(t, db.decideTxn(ctx, id, 1, base.DecisionAbort, 1), ErrTxnDecided)
		require.NoError(t, p.apply(ctx, base.DecisionCommit))
		require.ErrorIs(t, p.apply(ctx, base.DecisionCommit), ErrTxDone)
		select {
		case v := <-got:
			require.Equal(t, uint64(100), v)
		case <-ctx.Done():
			t.Fatal("the waiting reader never returned")
		}
		require.NoError(t, tb.Get(ctx, b, dst))
		require.Equal(t, uint64(200), binary.LittleEndian.Uint64(dst))
		// Ordinary commits after, on the same rows.
		require.NoError(t, db.Update(ctx, func(tx *Tx) error { return tx.Put(tb, a, prepRow(101)) }))
	})
}

// A transaction that read a row a prepared transaction then locked fails validation
// (ErrConflict), and a prepare over a row another prepared transaction holds conflicts at
// once rather than waiting.
func TestPrepareConflicts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	db := openConfigs(t)[0].opener(t)(Options{CacheBytes: 1 << 20})
	tb := newTable(t, ctx, db, "t", 64)
	a := insertRow(t, ctx, tb, prepRow(1))

	reader := openTx(t, ctx, db, true)
	dst := make([]byte, 64)
	require.NoError(t, reader.Get(tb, a, dst))
	require.NoError(t, reader.Put(tb, a, prepRow(2))) // in the write set, not locked yet

	tx := openTx(t, ctx, db, true)
	require.NoError(t, tx.Put(tb, a, prepRow(100)))
	p, err := tx.prepare(txnInfo{ID: [16]byte{1}, Lease: 1})
	require.NoError(t, err)

	_, err = reader.prepare(txnInfo{ID: [16]byte{2}, Lease: 1})
	require.ErrorIs(t, err, ErrConflict, "a row held by a prepared transaction: conflict, no wait")
	require.NoError(t, p.validate())
	require.NoError(t, db.decideTxn(ctx, [16]byte{1}, 1, base.DecisionCommit, 1))
	require.NoError(t, p.apply(ctx, base.DecisionCommit))
	require.NoError(t, tb.Get(ctx, a, dst))
	require.Equal(t, uint64(100), binary.LittleEndian.Uint64(dst))
}

// A prepare the storage node refuses (the decision already recorded as abort at the
// primary) unlocks the rows and gives its seq back: the next commit batch is accepted.
func TestPrepareRefusedGivesSeqBack(t *testing.T) {
	eachConfig(t, openConfigs(t)[:3:3], Options{CacheBytes: 1 << 20}, func(t *testing.T, db *DB) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		tb := newTable(t, ctx, db, "t", 64)
		a := insertRow(t, ctx, tb, prepRow(1))
		id := [16]byte{7}
		require.NoError(t, db.applyTxn(ctx, id, base.DecisionAbort)) // remembered: its prepare is refused
		tx := openTx(t, ctx, db, true)
		require.NoError(t, tx.Put(tb, a, prepRow(100)))
		p, err := tx.prepare(txnInfo{ID: id, Lease: 1})
		require.Nil(t, p)
		require.ErrorIs(t, err, ErrTxnDecided)
		require.False(t, errors.Is(err, ErrUnknownOutcome))
		dst := make([]byte, 64)
		require.NoError(t, tb.Get(ctx, a, dst), "unlocked")
		require.Equal(t, uint64(1), binary.LittleEndian.Uint64(dst))
		require.NoError(t, db.Update(ctx, func(tx *Tx) error { return tx.Put(tb, a, prepRow(5)) }), "the seq was given back")
		require.NoError(t, db.Update(ctx, func(tx *Tx) error { return tx.Put(tb, a, prepRow(6)) }))
	})
}

// lostAnswerStore delivers the first prepare but loses its answer (a timeout), as a
// connection that broke after the storage node logged it would.
type lostAnswerStore struct {
	store.Store
	lost atomic.Int64
}

func (s *lostAnswerStore) ts() store.TxnStore { return s.Store.(store.TxnStore) }

func (s *lostAnswerStore) PrepareTxn(ctx context.Context, p *base.TxnPrepare) (uint64, error) {
	lsn, err := s.ts().PrepareTxn(ctx, p)
	if err == nil && s.lost.Add(1) == 1 {
		return 0, context.DeadlineExceeded
	}
	return lsn, err
}

func (s *lostAnswerStore) DecideTxn(ctx context.Context, id base.TxnID, lease int64, d base.Decision, count int) (base.Decision, error) {
	return s.ts().DecideTxn(ctx, id, lease, d, count)
}

func (s *lostAnswerStore) ApplyTxn(ctx context.Context, id base.TxnID, d base.Decision) error {
	return s.ts().ApplyTxn(ctx, id, d)
}

// A prepare whose answer was lost returns its Prepared with ErrUnknownOutcome: the rows stay
// locked, later batches wait until the prepare sent again is answered (its seq is taken),
// and aborting it unlocks the rows with their old values; commits go on after.
func TestPrepareAnswerLost(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := &lostAnswerStore{Store: newLocalStore(t, "")}
	db := openDB(t, ctx, Options{Store: s, CacheBytes: 1 << 20})
	defer db.Close(ctx)
	tb := newTable(t, ctx, db, "t", 64)
	a := insertRow(t, ctx, tb, prepRow(1))
	b := insertRow(t, ctx, tb, prepRow(2))
	tx := openTx(t, ctx, db, true)
	require.NoError(t, tx.Put(tb, a, prepRow(100)))
	id := [16]byte{5}
	p, err := tx.prepare(txnInfo{ID: id, Lease: 1})
	require.ErrorIs(t, err, ErrUnknownOutcome)
	require.NotNil(t, p)
	// A commit meanwhile is held until the resent prepare is answered, then goes.
	require.NoError(t, db.Update(ctx, func(tx *Tx) error { return tx.Put(tb, b, prepRow(20)) }))
	require.GreaterOrEqual(t, s.lost.Load(), int64(2), "the prepare was sent again")
	require.NoError(t, db.decideTxn(ctx, id, 1, base.DecisionAbort, 1))
	require.NoError(t, p.apply(ctx, base.DecisionAbort))
	dst := make([]byte, 64)
	require.NoError(t, tb.Get(ctx, a, dst))
	require.Equal(t, uint64(1), binary.LittleEndian.Uint64(dst))
	require.NoError(t, db.Update(ctx, func(tx *Tx) error { return tx.Put(tb, a, prepRow(3)) }))
	require.NoError(t, tb.Get(ctx, b, dst))
	require.Equal(t, uint64(20), binary.LittleEndian.Uint64(dst))
}
