package storenode

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/vfs"
)

// txnFaultStore is a txnStore on a FaultFS, to be killed (kill -9) and reopened.
func txnFaultStore(t *testing.T, opts Options) (*txnStore, Options, *vfs.FaultFS) {
	t.Helper()
	fs := vfs.NewFaultFS()
	opts.Dir, opts.FS, opts.Logger, opts.TxnResolveInterval = "db", fs, quietLogger, -1
	e, err := Open(opts)
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	return setupTxnStore(t, e), opts, fs
}

// reopenTxnStore stops s's engine (Close when kill is false, else kill -9: nothing more
// reaches the disk, the WAL since the last checkpoint is replayed), requires Check to find no
// damage, and opens it again.
func reopenTxnStore(t *testing.T, s *txnStore, opts Options, fs *vfs.FaultFS, kill bool) *txnStore {
	t.Helper()
	if kill {
		fs.CrashKeepAll()
		s.e.Close()
	} else {
		require.NoError(t, s.e.Close())
	}
	requireCheckNoDamage(t, fs, opts.Dir, "before the reopen")
	e, err := Open(opts)
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	require.NoError(t, e.verify())
	return setupTxnStore(t, e)
}

// TestTxnReportOfAbortWithoutCount: a client's Decide(abort) of a made-up id with count 0
// (participants unknown, as a resolver's abort), a report of participant 5, and a
// checkpoint (here Close's) left a decide record of 0 participants reported 0x20, which replay
// and Check refused: the store never opened again. It reopens, the abort kept (never all
// reported without a count) until the coordinator names the count, and a count learned
// drops the reports beyond it. Fails on b3f6c9d: "decide record: 0 participants, reported
// 0x20".
func TestTxnReportOfAbortWithoutCount(t *testing.T) {
	s, opts, fs := txnFaultStore(t, Options{})
	ctx := context.Background()
	_, err := s.e.DecideTxn(ctx, txnID(1), 5, DecisionAbort, 0)
	require.NoError(t, err)
	require.NoError(t, s.e.ReportTxn(txnID(1), 5))
	require.NoError(t, s.e.Checkpoint())
	s = reopenTxnStore(t, s, opts, fs, false)
	require.Equal(t, TxnStatus{Primary: DecisionAbort}, s.e.TxnStatus(txnID(1)))

	// The coordinator's Decide names 2 participants: the report of 5 is dropped, 0 and 1
	// count.
	_, err = s.e.DecideTxn(ctx, txnID(1), 5, DecisionAbort, 2)
	require.NoError(t, err)
	require.NoError(t, s.e.ReportTxn(txnID(1), 0))
	s = reopenTxnStore(t, s, opts, fs, false)
	s.e.mu.Lock()
	d := *s.e.txnDecisions[txnID(1)]
	s.e.mu.Unlock()
	require.Equal(t, uint16(2), d.count)
	require.Equal(t, uint64(1), d.reported, "the report of participant 5 of 2 is dropped")
	require.ErrorIs(t, s.e.ReportTxn(txnID(1), 5), ErrMalformed)
	require.NoError(t, s.e.ReportTxn(txnID(1), 1))
	require.NoError(t, s.e.ResolveTxns(ctx))
	require.Equal(t, TxnStatus{}, s.e.TxnStatus(txnID(1)), "every participant reported: forgotten")
	s = reopenTxnStore(t, s, opts, fs, true)
	require.NoError(t, s.e.ResolveTxns(ctx))
	require.Equal(t, TxnStatus{}, s.e.TxnStatus(txnID(1)))
}

// TestDecideRecordOfAbortReportsBeyondCount: what the engine of b3f6c9d wrote decodes: an
// abort's reports beyond its count (count 0, or a count learned after them). A commit's
// still do not.
func TestDecideRecordOfAbortReportsBeyondCount(t *testing.T) {
	id := txnID(1)
	for _, c := range []struct {
		d        Decision
		count    uint16
		reported uint64
		ok       bool
	}{
		{DecisionAbort, 0, 0x20, true},
		{DecisionAbort, 0, ^uint64(0), true},
		{DecisionAbort, 2, 0x23, true},
		{DecisionAbort, 64, ^uint64(0), true},
		{DecisionCommit, 2, 0x3, true},
		{DecisionCommit, 2, 0x4, false},
		{DecisionCommit, 0, 0, false},
		{DecisionAbort, 65, 0, false},
	} {
		rec := appendTxnDecideRecord(nil, id, c.d, c.count, 9, c.reported)
		_, d, count, _, reported, err := decodeTxnDecideRecord(rec)
		if !c.ok {
			require.Error(t, err, "%+v", c)
			continue
		}
		require.NoError(t, err, "%+v", c)
		require.Equal(t, []any{c.d, c.count, c.reported}, []any{d, count, reported})
	}
}

// TestTxnReplayAbortForgottenThenCommit: an abort forgotten past TxnAbortKeep (in memory
// only), its memory expired too, then a Decide(commit) of the same id under a live lease:
// replay meets "abort, then commit" and must take the later one, as the engine did. Fails
// on b3f6c9d: "transaction ... decided abort, then commit".
func TestTxnReplayAbortForgottenThenCommit(t *testing.T) {
	clock := &fakeClock{}
	clock.Now()
	s, opts, fs := txnFaultStore(t, Options{Now: clock.Now, LeaseChecker: &memLeases{}})
	ctx := context.Background()
	_, err := s.e.DecideTxn(ctx, txnID(1), 5, DecisionAbort, 0)
	require.NoError(t, err)
	clock.Advance(DefaultTxnAbortKeep)
	require.NoError(t, s.e.ResolveTxns(ctx)) // the sweep forgets it
	require.Equal(t, TxnStatus{}, s.e.TxnStatus(txnID(1)))
	clock.Advance(DefaultTxnAbortKeep) // and the memory of it expires
	d, err := s.e.DecideTxn(ctx, txnID(1), 5, DecisionCommit, 1)
	require.NoError(t, err)
	require.Equal(t, DecisionCommit, d)
	s = reopenTxnStore(t, s, opts, fs, true)
	require.Equal(t, TxnStatus{Primary: DecisionCommit}, s.e.TxnStatus(txnID(1)))
}

// TestTxnReplayPartForgottenThenPreparedAgain: a participant's part applied, reported and
// forgotten, then prepared again under the same id (a new seq) and decided: replay must
// replace the applied part with the new prepare, not take it for a checkpoint's copy of the
// old one. Fails on b3f6c9d: "applied commit, then abort" for abort; for commit the second
// prepare's rows lost after the kill.
func TestTxnReplayPartForgottenThenPreparedAgain(t *testing.T) {
	for _, second := range []Decision{DecisionAbort, DecisionCommit} {
		t.Run(second.String(), func(t *testing.T) {
			peers := &memPeers{}
			primary := openTest(t, Options{TxnResolveInterval: -1, Logger: quietLogger})
			peers.set("p", primary)
			s, opts, fs := txnFaultStore(t, Options{TxnPeer: peers})
			ctx := context.Background()
			s.put(t, 1, 100)
			_, err := s.prepare(t, txnID(1), 5, "p", 0, 1, 150)
			require.NoError(t, err)
			_, err = primary.DecideTxn(ctx, txnID(1), 5, DecisionCommit, 1)
			require.NoError(t, err)
			require.NoError(t, s.e.ApplyTxn(txnID(1), DecisionCommit))
			require.NoError(t, s.e.ResolveTxns(ctx)) // reported, forgotten
			require.Equal(t, TxnStatus{}, s.e.TxnStatus(txnID(1)))
			_, err = s.prepare(t, txnID(1), 5, "p", 0, 1, 250)
			require.NoError(t, err)
			require.NoError(t, s.e.ApplyTxn(txnID(1), second))
			want := map[Decision]uint64{DecisionAbort: 150, DecisionCommit: 250}[second]
			require.Equal(t, want, s.get(t, 1))
			s = reopenTxnStore(t, s, opts, fs, true)
			require.Equal(t, want, s.get(t, 1))
			require.Equal(t, TxnStatus{Applied: second}, s.e.TxnStatus(txnID(1)))
		})
	}
}
