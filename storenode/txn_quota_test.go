package storenode

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/vfs"
)

// ownerStore is a txnStore of another owner than testOwner, on a table of its own.
func ownerStore(t testing.TB, e *Engine, name string, owner uint64) *txnStore {
	t.Helper()
	info, err := e.CreateTable(name, 64)
	require.NoError(t, err)
	g := acquire(t, e, info.ID, owner, 0)
	requireGranted(t, e, info.ID, owner, g.Epoch)
	return &txnStore{e: e, table: info.ID, epoch: g.Epoch, seq: g.LastSeq, owner: owner}
}

// TestTxnPrepareOwnerQuota: one owner's prepares (its transactions' primary unreachable,
// never decided) are bounded in count (MaxTxnsPerOwner) and bytes (MaxTxnBytesPerOwner):
// past them that owner gets ErrTxnBusy, another owner still prepares; applied parts give
// their room back. Fails on b3f6c9d: the flooding owner takes all of MaxTxns, and the other
// owner's prepare gets ErrTxnBusy.
func TestTxnPrepareOwnerQuota(t *testing.T) {
	s := newTxnStore(t, Options{MaxTxns: 8, MaxTxnsPerOwner: 4, MaxTxnBytesPerOwner: 8 << 10})
	other := ownerStore(t, s.e, "other", testOwner+1)
	for i := range 4 {
		_, err := s.prepare(t, txnID(byte(i)), 1, "unreachable:1", 1, uint64(i), 1)
		require.NoError(t, err, "prepare %d", i)
	}
	_, err := s.prepare(t, txnID(4), 1, "unreachable:1", 1, 4, 1)
	require.ErrorIs(t, err, ErrTxnBusy, "past MaxTxnsPerOwner")
	s.seq--
	_, err = other.prepare(t, txnID(10), 1, "unreachable:1", 1, 1, 1)
	require.NoError(t, err, "another owner still prepares")

	require.NoError(t, s.e.ApplyTxn(txnID(0), base.DecisionAbort))
	_, err = s.prepare(t, txnID(5), 1, "unreachable:1", 1, 5, 1)
	require.NoError(t, err, "the applied part gave its room back")
	parts, _ := s.e.TxnCounts()
	require.Equal(t, 6, parts)

	// Bytes: a page of rows (4 KiB) fits MaxTxnBytesPerOwner once, not twice.
	s = newTxnStore(t, Options{MaxTxnBytesPerOwner: 6 << 10})
	other = ownerStore(t, s.e, "other", testOwner+1)
	page := func(st *txnStore, id base.TxnID, pg uint64) error {
		seg := oneRow(st.table, pg*64, nil)
		seg.Data, seg.Rows = ^uint64(0), make([]byte, 64*64)
		_, err := st.e.PrepareTxn(&base.TxnPrepare{Txn: id, Lease: 1, Primary: "unreachable:1", Index: 1, Batch: st.batch(seg)})
		if err != nil {
			st.seq--
		}
		return err
	}
	require.NoError(t, page(s, txnID(1), 1))
	require.ErrorIs(t, page(s, txnID(2), 2), ErrTxnBusy, "past MaxTxnBytesPerOwner")
	require.NoError(t, page(other, txnID(3), 1), "another owner still prepares")
	require.NoError(t, s.e.ApplyTxn(txnID(1), base.DecisionAbort))
	require.NoError(t, page(s, txnID(2), 2), "the applied part gave its bytes back")
}

// TestTxnCarryInChunks: a checkpoint re-logs the prepared parts in chunks with the engine
// lock released between (a hook runs there): another owner's commit goes through in the
// middle of the re-log, and a part applied there, before its turn, is carried first, so the
// reopened store holds the applied rows and the other parts still prepared. Fails on
// b3f6c9d: the re-log runs in the snapshot's one lock hold (no chunks).
func TestTxnCarryInChunks(t *testing.T) {
	fs := vfs.NewFaultFS()
	opts := Options{Dir: "db", FS: fs, CheckpointInterval: -1, CheckpointWALBytes: -1, TxnResolveInterval: -1, Logger: quietLogger}
	e := openEngine(t, opts)
	s := setupTxnStore(t, e)
	other := ownerStore(t, e, "other", testOwner+1)
	const parts = 8
	for i := range parts {
		s.requirePrepared(t, txnID(byte(i)), 1, "", 0, uint64(i), uint64(100+i))
	}
	e.txnCarry.chunkBytes = 1 // one record a chunk
	chunks := 0
	e.txnCarry.between = func() {
		chunks++
		if chunks == 1 {
			other.put(t, 1, 11) // would deadlock if the re-log held the lock
			e.mu.Lock()
			var notYet base.TxnID
			found := false
			for id := range e.txnCarry.pending {
				notYet, found = id, true
				break
			}
			e.mu.Unlock()
			require.True(t, found)
			require.NoError(t, e.ApplyTxn(notYet, base.DecisionCommit))
		}
	}
	require.NoError(t, e.Checkpoint())
	require.GreaterOrEqual(t, chunks, parts-2, "a chunk per record")
	e.txnCarry.between = nil
	committed := -1
	for i := range parts {
		if e.TxnStatus(txnID(byte(i))).Applied == base.DecisionCommit {
			committed = i
		}
	}
	require.GreaterOrEqual(t, committed, 0)
	fs.CrashKeepAll()
	_ = e.Close()

	e = openEngine(t, opts)
	defer e.Close()
	s = setupTxnStore(t, e)
	for i := range parts {
		st := e.TxnStatus(txnID(byte(i)))
		if i == committed {
			require.Equal(t, base.DecisionCommit, st.Applied, "part %d", i)
			require.Equal(t, uint64(100+i), s.get(t, uint64(i)))
		} else {
			require.True(t, st.Prepared, "part %d", i)
		}
	}
	other.e = e
	row, ok := readRow(t, e, other.table, 1)
	require.True(t, ok)
	require.Equal(t, uint64(11), uint64FromRow(row))
}
