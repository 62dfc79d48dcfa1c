package storenode

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/testkit"
)

// A batch refused before anything of it was applied (here: fenced) leaves a gap in its
// owner's seqs that only the owner can fill: its later batches, whether already waiting for
// the gap or arriving after the refusal, fail at once with ErrSeqGap naming the refused seq,
// instead of waiting SeqGapWait each (one after another on their connection: up to a
// transaction node's eight batches in flight times SeqGapWait). The owner's batch of the
// refused seq, sent again, is applied and the window goes on. Fails on 964dade: the later
// batches waited out SeqGapWait (an hour here).
func TestRefusedBatchFailsLaterSeqsAtOnce(t *testing.T) {
	e, _, info, g := openFault(t, Options{SeqGapWait: time.Hour}, testOwner)
	commitWait(t, e, batchOf(testOwner, 1, info.ID, g.Epoch, oneRow(info.ID, 1, row64(1))))

	// Seq 3 arrives first and waits for seq 2; seq 2 is refused (a stale epoch).
	waiting := commitAsync(e, batchOf(testOwner, 3, info.ID, g.Epoch, oneRow(info.ID, 3, row64(3))))
	waitGapWaiter(t, e)
	_, err := e.CommitWait(batchOf(testOwner, 2, info.ID, g.Epoch+7, oneRow(info.ID, 2, row64(2))))
	require.ErrorIs(t, err, ErrFenced)
	err = waitErr(t, waiting, "the batch waiting behind the refused one")
	require.ErrorIs(t, err, ErrSeqGap)
	require.ErrorContains(t, err, "seq 2 was refused")

	// Arriving after the refusal: refused at once too.
	_, err = e.CommitWait(batchOf(testOwner, 4, info.ID, g.Epoch, oneRow(info.ID, 4, row64(4))))
	require.ErrorIs(t, err, ErrSeqGap)

	// The owner fills the gap: applied, and the window goes on.
	commitWait(t, e, batchOf(testOwner, 2, info.ID, g.Epoch, oneRow(info.ID, 2, row64(2))))
	commitWait(t, e, batchOf(testOwner, 3, info.ID, g.Epoch, oneRow(info.ID, 3, row64(3))))
	requireRowsOwnIDs(t, e, info.ID, 3)
}

// requireRowsOwnIDs: rows 1 to last of table are there, each holding its own id.
func requireRowsOwnIDs(t *testing.T, e *Engine, table uint32, last uint64) {
	t.Helper()
	for id := uint64(1); id <= last; id++ {
		row, ok := readRow(t, e, table, id)
		require.True(t, ok, "row %d", id)
		require.Equal(t, id, uint64FromRow(row))
	}
}

// waitGapWaiter waits until a batch of the engine waits for a gap in its owner's seqs.
func waitGapWaiter(t *testing.T, e *Engine) {
	t.Helper()
	testkit.SpinUntil(t, idWait, "no batch waits for the gap", func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.gapWaiters > 0
	})
}

// An owner's first batches: an owner without an owners-table entry (no batch applied yet)
// starts its window at any seq, so when its first batch (seq 1) was refused, its seq 2,
// already in flight behind it, was applied without it: a transaction of seq 2 may have read
// a row of seq 1 (a transaction node's cache shows a transaction's rows before its batch is
// durable), so the store held a write that depends on one that never happened. The refused
// seq holds the owner's later seqs back as for an owner with an entry (ErrSeqGap naming it)
// until it is sent again. Fails on bc2d8a2: seq 2 was applied.
func TestRefusedFirstBatchFailsLaterSeqs(t *testing.T) {
	e, _, info, g := openFault(t, Options{SeqGapWait: time.Hour}, testOwner)
	_, err := e.CommitWait(batchOf(testOwner, 1, info.ID, g.Epoch+7, oneRow(info.ID, 1, row64(1))))
	require.ErrorIs(t, err, ErrFenced)
	_, err = e.CommitWait(batchOf(testOwner, 2, info.ID, g.Epoch, oneRow(info.ID, 2, row64(2))))
	require.ErrorIs(t, err, ErrSeqGap, "seq 2 applied although seq 1 was refused")
	require.ErrorContains(t, err, "seq 1 was refused")
	_, ok := readRow(t, e, info.ID, 2)
	require.False(t, ok)

	// The owner sends seq 1 again: applied, and the window goes on; the refusal is forgotten.
	commitWait(t, e, batchOf(testOwner, 1, info.ID, g.Epoch, oneRow(info.ID, 1, row64(1))))
	commitWait(t, e, batchOf(testOwner, 2, info.ID, g.Epoch, oneRow(info.ID, 2, row64(2))))
	requireRowsOwnIDs(t, e, info.ID, 2)
	e.mu.Lock()
	require.Empty(t, e.refusedFresh)
	e.mu.Unlock()
}
