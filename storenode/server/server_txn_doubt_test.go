package server

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// TestServerTxnDoubtListAndAbort: the operator's TxnDoubt request lists a part prepared and
// never decided once it is older than TxnInDoubtAfter (its owner, lease, table, primary) and
// aborts it, unlocking its rows; a younger one is refused. Fails on b3f6c9d (no TxnDoubt):
// the part's rows stay locked.
func TestServerTxnDoubtListAndAbort(t *testing.T) {
	leases, clock := &txnLeases{}, &fakeClock{}
	a := startTxnNode(t, leases, clock)
	ctx := srvCtx(t)
	require.NoError(t, a.coord.CallInto(ctx, a.commit(1, 1000), &sgio.CommitAck{}))
	txn := [16]byte{5}
	leases.addNode("lost.example:7070") // a storage node of the map, gone
	_, err := a.coord.PrepareTxn(ctx, &sgio.TxnPrepare{Txn: txn, Lease: 41, Index: 1, Primary: "lost.example:7070",
		Commit: *a.commit(1, 990)})
	require.NoError(t, err)

	_, err = a.coord.TxnsInDoubt(ctx)
	require.ErrorIs(t, err, sgio.ErrForbidden, "an operator's request: a client's credential is refused")
	op := a.env.dial(0, asOperator)
	defer op.Close()
	l, err := op.TxnsInDoubt(ctx)
	require.NoError(t, err)
	require.Zero(t, l.Total, "younger than TxnInDoubtAfter")
	_, err = op.AbortInDoubt(ctx, txn)
	require.ErrorIs(t, err, sgio.ErrMalformed)

	clock.Advance(storenode.DefaultTxnInDoubtAfter)
	l, err = op.TxnsInDoubt(ctx)
	require.NoError(t, err)
	require.Equal(t, uint32(1), l.Total)
	require.Equal(t, []sgio.TxnDoubtEntry{{Txn: txn, Owner: testOwner, Lease: 41,
		AgeMillis: uint64(storenode.DefaultTxnInDoubtAfter / time.Millisecond), Table: a.table, Primary: "lost.example:7070"}}, l.Entries)
	d, err := op.AbortInDoubt(ctx, txn)
	require.NoError(t, err)
	require.Equal(t, txn, d.Txn)
	require.Equal(t, base.DecisionAbort, a.eng().TxnStatus(txn).Applied)
	require.NoError(t, a.coord.CallInto(ctx, a.commit(1, 5), &sgio.CommitAck{}), "the row is unlocked")
	require.Equal(t, uint64(5), a.balance(t, 1))
}
