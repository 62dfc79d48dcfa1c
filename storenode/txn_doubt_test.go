package storenode

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
)

// TestTxnInDoubtListedAndAborted: a part prepared and never decided, then the owner's
// Release: no other owner can acquire the table, nobody can drop it, across a reopen. Once
// prepared for TxnInDoubtAfter it is listed (owner, table, age, primary) and counted in the
// txn_in_doubt gauge, and an operator's AbortInDoubt unlocks the table: it is acquired and
// dropped again, and stays so across a reopen. Younger, it is refused. At its primary the
// abort is recorded first; a commit recorded there is never overridden. Fails on b3f6c9d
// (no TxnsInDoubt, AbortInDoubt): the table stays locked for ever.
func TestTxnInDoubtListedAndAborted(t *testing.T) {
	clock := &fakeClock{}
	opts := Options{Dir: t.TempDir(), Now: clock.Now, TxnResolveInterval: -1, TxnInDoubtAfter: time.Minute}
	e := openEngine(t, opts)
	s := setupTxnStore(t, e)
	s.requirePrepared(t, txnID(1), 5, "", 0, 1, 150)
	s.requirePrepared(t, txnID(2), 6, "lost:7070", 1, 2, 250)
	s.requirePrepared(t, txnID(3), 7, "", 0, 3, 350)
	_, err := e.DecideTxn(t.Context(), txnID(3), 7, base.DecisionCommit, 1)
	require.NoError(t, err)
	require.NoError(t, e.Release(s.table, testOwner, s.epoch))

	locked := func(e *Engine) {
		t.Helper()
		_, err := e.Acquire(s.table, testOwner+1, 0)
		require.ErrorIs(t, err, ErrTxnLocked)
		require.ErrorIs(t, e.DropTable("bank", testOwner+1), ErrTxnLocked)
	}
	locked(e)
	list, n := e.TxnsInDoubt(0)
	require.Empty(t, list, "younger than TxnInDoubtAfter")
	require.Zero(t, n)
	_, err = e.AbortInDoubt(txnID(1))
	require.ErrorIs(t, err, ErrTxnNotInDoubt)

	require.NoError(t, e.Close())
	e = openEngine(t, opts)
	locked(e)
	clock.Advance(time.Minute)
	list, n = e.TxnsInDoubt(0)
	require.Equal(t, 4, n, "three parts, and txn 3's commit kept here for its report")
	require.Len(t, list, 4)
	byID := map[base.TxnID]TxnInDoubt{}
	for _, d := range list {
		if d.Decision != base.DecisionNone {
			require.Equal(t, TxnInDoubt{ID: txnID(3), Owner: testOwner, Lease: 7, Age: d.Age, Decision: base.DecisionCommit}, d)
			continue
		}
		byID[d.ID] = d
		require.Equal(t, uint64(testOwner), d.Owner)
		require.Equal(t, s.table, d.Table)
		require.GreaterOrEqual(t, d.Age, time.Minute)
	}
	require.Equal(t, "lost:7070", byID[txnID(2)].Primary)
	require.Equal(t, "", byID[txnID(1)].Primary)
	require.Equal(t, int64(6), byID[txnID(2)].Lease)
	require.Equal(t, 3, e.Stats().TxnInDoubt)
	first, _ := e.TxnsInDoubt(1)
	require.Len(t, first, 1, "bounded by max")

	_, err = e.AbortInDoubt(txnID(3))
	require.ErrorIs(t, err, ErrTxnDecided, "commit recorded at this node, its primary: not overridden")
	require.True(t, e.TxnStatus(txnID(3)).Prepared)
	require.NoError(t, e.ApplyTxn(txnID(3), base.DecisionCommit)) // what its resolver does
	for _, id := range []base.TxnID{txnID(1), txnID(2)} {
		d, err := e.AbortInDoubt(id)
		require.NoError(t, err)
		require.Equal(t, id, d.ID)
	}
	require.Equal(t, base.DecisionAbort, e.TxnStatus(txnID(1)).Primary, "the abort recorded at its primary")
	require.Zero(t, e.Stats().TxnInDoubt)
	_, err = e.AbortInDoubt(txnID(1))
	require.ErrorIs(t, err, ErrTxnNotInDoubt, "applied already")

	require.NoError(t, e.Close())
	e = openEngine(t, opts)
	defer e.Close()
	list, _ = e.TxnsInDoubt(0)
	require.Empty(t, list)
	clock.Advance(DefaultLeaseDuration + time.Second) // a reopen gives the holder a lease
	_, err = e.Acquire(s.table, testOwner+1, 0)
	require.NoError(t, err, "the table is acquired again")
	row, ok := readRow(t, e, s.table, 3)
	require.True(t, ok)
	require.Equal(t, uint64(350), uint64FromRow(row))
	require.NoError(t, e.DropTable("bank", testOwner+1), "and dropped")
}
