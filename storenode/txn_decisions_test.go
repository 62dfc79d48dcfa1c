package storenode

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
)

// TestTxnDecisionsPerOwnerBound: the decisions kept for an owner's parts (a commit naming
// participants that never report is kept for ever) are at most MaxTxnsPerOwner: its next
// Decide from a session (DecideTxnAs) is refused with ErrTxnBusy, another owner's is not (issue 22's hostile review,
// defect 6). After a restart the decisions of parts still prepared count again (a
// checkpoint carries the decisions before the parts), those of applied parts do not (owner
// unknown); a decision forgotten (every participant reported) frees its place. Kept for
// TxnInDoubtAfter, the decisions are listed by TxnsInDoubt. Fails on b3f6c9d: the owner's
// fourth Decide is recorded.
func TestTxnDecisionsPerOwnerBound(t *testing.T) {
	clock := &fakeClock{}
	opts := Options{Dir: t.TempDir(), Now: clock.Now, TxnResolveInterval: -1, MaxTxnsPerOwner: 3, TxnInDoubtAfter: time.Minute}
	e := openEngine(t, opts)
	s := setupTxnStore(t, e)
	ctx := t.Context()
	decide := func(e *Engine, n byte) error {
		owner := uint64(testOwner)
		if n == 9 {
			owner++
		}
		_, err := e.DecideTxnAs(ctx, owner, txnID(n), 5, base.DecisionCommit, txnParticipantsMax, 0)
		return err
	}
	for n := byte(1); n <= 3; n++ {
		s.primaryPart(t, txnID(n), 5)
		require.NoError(t, decide(e, n))
	}
	require.NoError(t, e.ApplyTxn(txnID(1), base.DecisionCommit))
	s.primaryPart(t, txnID(4), 5)
	require.ErrorIs(t, decide(e, 4), ErrTxnBusy, "the owner's fourth decision kept")

	info, err := e.CreateTable("other", 64)
	require.NoError(t, err)
	g := acquire(t, e, info.ID, testOwner+1, 0)
	requireGranted(t, e, info.ID, testOwner+1, g.Epoch)
	o := &txnStore{e: e, table: info.ID, epoch: g.Epoch, seq: g.LastSeq, owner: testOwner + 1}
	o.primaryPart(t, txnID(9), 5)
	require.NoError(t, decide(e, 9), "another owner's Decide")

	require.NoError(t, e.Checkpoint())
	require.NoError(t, e.Close())
	e = openEngine(t, opts)
	defer e.Close()
	require.NoError(t, decide(e, 4), "after a restart, txn 1's decision (its part applied) counts no more")
	require.NoError(t, e.ApplyTxn(txnID(2), base.DecisionCommit))
	s.e = e
	s.primaryPart(t, txnID(5), 5)
	require.ErrorIs(t, decide(e, 5), ErrTxnBusy, "after a restart, the decisions of the parts prepared count")

	clock.Advance(time.Minute)
	list, _ := e.TxnsInDoubt(0)
	kept := map[base.TxnID]TxnInDoubt{}
	for _, d := range list {
		if d.Decision != base.DecisionNone {
			kept[d.ID] = d
		}
	}
	require.Len(t, kept, 5, "the commits kept a minute, their participants not all reported")
	require.Equal(t, TxnInDoubt{ID: txnID(3), Owner: testOwner, Lease: 5, Age: time.Minute, Decision: base.DecisionCommit}, kept[txnID(3)])

	require.NoError(t, e.ApplyTxn(txnID(3), base.DecisionCommit))
	for i := range txnParticipantsMax {
		require.NoError(t, e.ReportTxn(txnID(3), uint16(i)))
	}
	require.NoError(t, decide(e, 5), "a forgotten decision frees its place")
}
