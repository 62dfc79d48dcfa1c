package storenode

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/internal/vfs"
)

// Defects found in the hostile review of issue 10's work, one regression test each.

// A retry of a batch that was durable before the engine failed is acknowledged, with its own
// LSN: a fail-stop later must not turn it into a definite failure (the application would
// take a durable batch for a lost one), and a retry of a batch whose outcome the failure
// left open is an unknown outcome, never a plain fail-stop. Fails on 767c454 and on the
// reviewed code, which answered both with ErrFailStop before looking at the dedup window.
func TestRetryAfterFailStopKeepsOutcome(t *testing.T) {
	e, fs, info, g := openFault(t, Options{}, testOwner)
	durable := batchOf(testOwner, 1, info.ID, g.Epoch, oneRow(info.ID, 1, row64(1)))
	lsn1, err := e.CommitWait(durable)
	require.NoError(t, err)

	fs.SetFailAt(vfs.OpSync, 1, nil)
	failed := batchOf(testOwner, 2, info.ID, g.Epoch, oneRow(info.ID, 2, row64(2)))
	_, err = e.CommitWait(failed)
	require.ErrorIs(t, err, ErrUnknownOutcome)
	require.ErrorIs(t, err, ErrFailStop)

	lsn, err := e.CommitWait(durable) // its acknowledgement was lost; it is durable
	require.NoError(t, err, "a durable batch retried after the fail-stop")
	require.Equal(t, lsn1, lsn)

	_, err = e.CommitWait(failed)
	require.ErrorIs(t, err, ErrUnknownOutcome, "its write failed: it may survive a restart")
	require.ErrorIs(t, err, ErrFailStop)

	other := batchOf(testOwner, 2, info.ID, g.Epoch, oneRow(info.ID, 3, row64(3)))
	_, err = e.CommitWait(other)
	require.ErrorIs(t, err, ErrSeqReused, "not the batch applied under seq 2")

	_, err = e.CommitWait(batchOf(testOwner, 3, info.ID, g.Epoch, oneRow(info.ID, 3, row64(3))))
	require.ErrorIs(t, err, ErrFailStop, "a new batch fails definitely")
	require.NotErrorIs(t, err, ErrUnknownOutcome)
}
