package server

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// TestServerTxnDecideOnlyByPreparingOwner: a TxnDecide is checked against the session's
// owner: another owner's session cannot decide (commit or abort) a part the coordinator
// prepared at its primary, nor record a commit of a made-up id; the coordinator's own Decide
// then succeeds. Fails on b3f6c9d: the other owner's commit is recorded.
func TestServerTxnDecideOnlyByPreparingOwner(t *testing.T) {
	leases, clock := &txnLeases{}, &fakeClock{}
	a := startTxnNode(t, leases, clock)
	ctx := srvCtx(t)
	require.NoError(t, a.coord.CallInto(ctx, a.commit(1, 1000), &sgio.CommitAck{}))
	txn := [16]byte{7}
	_, err := a.coord.PrepareTxn(ctx, &sgio.TxnPrepare{Txn: txn, Lease: 41, Commit: *a.commit(1, 990)})
	require.NoError(t, err)

	other := a.env.dial(testOwner + 1)
	defer other.Close()
	_, err = other.DecideTxn(ctx, txn, 41, sgio.TxnCommit, 1)
	require.ErrorIs(t, err, storenode.ErrTxnDecided, "another owner's commit")
	_, err = other.DecideTxn(ctx, txn, 41, sgio.TxnAbort, 1)
	require.ErrorIs(t, err, storenode.ErrTxnDecided, "another owner's abort")
	_, err = other.DecideTxn(ctx, [16]byte{8}, 41, sgio.TxnCommit, 64)
	require.ErrorIs(t, err, storenode.ErrTxnDecided, "a commit of a made-up id")
	_, decisions := a.eng().TxnCounts()
	require.Zero(t, decisions)

	d, err := a.coord.DecideTxn(ctx, txn, 41, sgio.TxnCommit, 1)
	require.NoError(t, err)
	require.Equal(t, sgio.TxnCommit, d)
	require.NoError(t, a.coord.ApplyTxn(ctx, txn, sgio.TxnCommit))
	require.Equal(t, uint64(990), a.balance(t, 1))
}
