package storenode

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
)

// primaryPart prepares id's part at s, its primary, as the protocol does before a Decide
// (the coordinator prepares every participant, the primary's part too, then decides): row
// 100 + the id's last byte.
func (s *txnStore) primaryPart(t testing.TB, id base.TxnID, lease int64) {
	t.Helper()
	s.requirePrepared(t, id, lease, "", 0, 100+uint64(id[15]), uint64(id[15]))
}

// TestTxnDecideFloodOfUnpreparedIDs: Decide{commit, 64 participants} of 4096 made-up ids
// (and Decide{abort} of as many) record nothing at the primary, which holds no part of them;
// a real coordinator's prepare and Decide then succeed, before and after a restart. A Decide
// from another owner than the part's, or under another lease, is refused too. Fails on
// b3f6c9d: the made-up commits fill the decisions table, and the real Decide gets ErrTxnBusy.
func TestTxnDecideFloodOfUnpreparedIDs(t *testing.T) {
	leases := &countingLeases{}
	opts := Options{Dir: t.TempDir(), TxnResolveInterval: -1, LeaseChecker: leases, MaxTxns: 64}
	e := openEngine(t, opts)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(22, 5))
	for i := range 4096 {
		var id base.TxnID
		binary.LittleEndian.PutUint64(id[:8], rng.Uint64())
		binary.LittleEndian.PutUint64(id[8:], rng.Uint64())
		d := base.DecisionCommit
		if i%2 == 1 {
			d = base.DecisionAbort
		}
		got, err := e.DecideTxn(ctx, id, int64(rng.Uint64()>>1), d, txnParticipantsMax)
		if d == base.DecisionCommit {
			require.ErrorIs(t, err, ErrTxnNotPrepared, "Decide %d", i)
			require.ErrorIs(t, err, ErrTxnDecided, "the transaction cannot commit here")
		} else {
			require.NoError(t, err, "Decide %d", i)
			require.Equal(t, base.DecisionAbort, got)
		}
	}
	_, decisions := e.TxnCounts()
	require.Zero(t, decisions, "nothing recorded for the made-up ids")
	require.Zero(t, leases.calls.Load(), "no lease check for them either")

	for round := range 2 {
		s := setupTxnStore(t, e)
		id := txnID(byte(1 + round))
		s.primaryPart(t, id, 5)
		_, err := e.DecideTxnAs(ctx, testOwner+1, id, 5, base.DecisionCommit, 1, 0)
		require.ErrorIs(t, err, ErrTxnNotPrepared, "another owner decides")
		_, err = e.DecideTxnAs(ctx, testOwner+1, id, 5, base.DecisionAbort, 1, 0)
		require.ErrorIs(t, err, ErrTxnNotPrepared, "another owner aborts")
		_, err = e.DecideTxnAs(ctx, testOwner, id, 6, base.DecisionCommit, 1, 0)
		require.ErrorIs(t, err, ErrTxnNotPrepared, "another lease")
		d, err := e.DecideTxnAs(ctx, testOwner, id, 5, base.DecisionCommit, 1, 0)
		require.NoError(t, err, "round %d: the real coordinator's Decide", round)
		require.Equal(t, base.DecisionCommit, d)
		require.NoError(t, e.ApplyTxn(id, base.DecisionCommit))
		require.NoError(t, e.ResolveTxns(ctx))
		require.Equal(t, TxnStatus{}, e.TxnStatus(id))
		require.NoError(t, e.Close())
		e = openEngine(t, opts)
		_, decisions = e.TxnCounts()
		require.Zero(t, decisions, "round %d: nothing live after the restart", round)
	}
	require.NoError(t, e.Close())
}

// countingLeases is memLeases counting its calls.
type countingLeases struct {
	memLeases
	calls atomic.Int64
}

func (l *countingLeases) LeaseAlive(ctx context.Context, lease int64) (bool, error) {
	l.calls.Add(1)
	return l.memLeases.LeaseAlive(ctx, lease)
}
