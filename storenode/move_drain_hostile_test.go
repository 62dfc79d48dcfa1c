package storenode

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
)

// Hostile review of the drain of a source whose freeze was refused for a transaction in
// doubt (move.go moveDrains; txn.go prepareLocked).

// A prepare refused by the drain burns no seq: the owner's next batch of that seq applies
// (no ErrSeqGap), the transaction in doubt decides, a prepare after the drain goes through,
// and a restart replays all of it (the drain is memory only: nothing of it is logged) and
// takes the next seq and a freeze.
func TestMoveDrainRefusalLeavesNoSeqGapAcrossReplay(t *testing.T) {
	clock := &fakeClock{}
	p := newMovePairAt(t, clock.Now)
	prepare := func(txn byte, id, v uint64) error {
		p.seq++
		_, err := p.src.PrepareTxn(&base.TxnPrepare{Txn: txnID(txn), Lease: 5, Batch: &base.Batch{Owner: p.owner, Seq: p.seq,
			Fences: []base.Fence{{Table: p.srcID, Epoch: p.epoch}}, Segments: []base.Segment{oneRow(p.srcID, id, row64(v))}}})
		if err != nil {
			p.seq--
		}
		return err
	}
	require.NoError(t, prepare(1, 64, 1))
	_, err := p.src.MoveFreeze(p.srcID, 5)
	require.ErrorIs(t, err, ErrTxnLocked)
	require.ErrorIs(t, prepare(2, 65, 2), ErrMoved, "drained")
	require.NoError(t, p.put(66, 3), "the refused prepare's seq is taken by a commit: no gap")
	require.NoError(t, p.src.ApplyTxn(txnID(1), base.DecisionCommit))
	clock.Advance(MoveDrainFor)
	require.NoError(t, prepare(2, 65, 2), "the drain ended")
	require.NoError(t, p.src.ApplyTxn(txnID(2), base.DecisionCommit))

	p.src.crashForTest()
	p.src = openTest(t, Options{Dir: p.srcDir, GrantVerifier: p.v, TxnResolveInterval: -1, Now: clock.Now})
	for id, v := range map[uint64]uint64{64: 1, 65: 2, 66: 3} {
		row, ok := readRow(t, p.src, p.srcID, id)
		require.True(t, ok, "row %d replayed", id)
		require.Equal(t, row64(v), row, "row %d", id)
	}
	require.NoError(t, p.put(67, 4), "the next seq after the replay")
	require.NoError(t, prepare(3, 68, 5), "no drain after a restart")
	require.NoError(t, p.src.ApplyTxn(txnID(3), base.DecisionCommit))
	_, err = p.src.MoveFreeze(p.srcID, 5)
	require.NoError(t, err, "nothing in doubt: frozen")
}
