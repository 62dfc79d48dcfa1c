package storenode

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/logicpage"
)

// The page index's nodes count against the cache budget beside the frames, so the room a
// checkpoint has is the budget less the dirty frames and the index they need, not the budget
// less the dirty frames alone. Pages one per 1,024-page range cost a 4 KiB leaf each: the index
// of a dirty set of them is about half the cache, the dirty frames can never reach 7/8 (or
// even half) of it, and a trigger that ignored the index never fired: every checkpoint was a
// commit stalling on a cache full of dirty pages. Sequential commits, no WAL or time trigger:
// a checkpoint runs only when the cache trigger asks for one, and the test stops at the first
// commit after which the room is below the headroom, which must have asked.
func TestCacheTriggerCountsIndexBytes(t *testing.T) {
	const frames = 64
	cost := int64(4096 + frameOverheadBytes)
	e, err := Open(Options{Dir: "db", FS: vfs.NewFaultFS(), Logger: quietLogger, Sync: SyncNone,
		CheckpointInterval: -1, CheckpointWALBytes: -1, CacheBytes: frames * cost})
	require.NoError(t, err)
	defer e.Close()
	info, err := e.CreateTable("t", 64)
	require.NoError(t, err)
	g, err := e.Acquire(info.ID, testOwner, 0)
	require.NoError(t, err)
	_, err = grantPages(e, info.ID, testOwner, g.Epoch, frames*pixFan)
	require.NoError(t, err)
	e.mu.Lock()
	budget := e.cache.budgetBytes
	e.trig.headroom = budget / 8 // as a checkpoint of a cached table measures it
	e.mu.Unlock()
	for k := range uint64(frames) {
		id := k * pixFan * logicpage.RowsPerPage
		_, err := e.CommitWait(batchOf(testOwner, k+1, info.ID, g.Epoch, oneRow(info.ID, id, row64(k))))
		require.NoError(t, err)
		e.mu.Lock()
		index := e.cache.index.bytes
		room := budget - e.cache.dirtyBytes - index
		pressure, stalled := e.cachePressure(), e.stats.stallMaxNs.Load()
		e.mu.Unlock()
		require.Zero(t, stalled, "commit %d stalled for room before the trigger fired", k)
		if room < budget/8 {
			require.True(t, pressure, "room %d of %d (index %d bytes) is below the headroom %d", room, budget, index, budget/8)
			return
		}
	}
	t.Fatal("the room never fell below the headroom")
}

// A transaction's apply that stalls for room is a commit stall like any other: the checkpoint
// it waited for restores the half-cache trigger, and its stall counts in the stall statistics. A cached table's
// updates (no allocation beside the checkpoints) set the headroom to 1/8; a prepared
// transaction over more new pages than the cache has room for then stalls on its apply.
func TestCacheTriggerTxnApplyStall(t *testing.T) {
	const pages, txnPages = 48, 34
	cost := int64(4096 + frameOverheadBytes)
	e := openTest(t, Options{Dir: "db", FS: vfs.NewFaultFS(), Logger: quietLogger, Sync: SyncNone,
		CheckpointInterval: -1, CheckpointWALBytes: -1, TxnResolveInterval: -1, CacheBytes: 80 * cost})
	s := setupTxnStore(t, e)
	_, err := grantPages(e, s.table, testOwner, s.epoch, pages+txnPages)
	require.NoError(t, err)
	pass := func(v uint64) {
		for p := range uint64(pages) {
			s.put(t, p*logicpage.RowsPerPage, v)
		}
	}
	pass(1)
	require.NoError(t, e.Checkpoint())
	pass(2)
	require.NoError(t, e.Checkpoint())
	pass(3)
	e.mu.Lock()
	budget, headroom, pressure := e.cache.budgetBytes, e.trig.headroom, e.cachePressure()
	e.mu.Unlock()
	require.Equal(t, budget/8, headroom)
	require.False(t, pressure)

	segs := make([]Segment, txnPages)
	for i := range segs {
		segs[i] = oneRow(s.table, uint64(pages+i)*logicpage.RowsPerPage, row64(uint64(i)))
	}
	_, err = e.PrepareTxn(&TxnPrepare{Txn: txnID(1), Lease: 9, Batch: s.batch(segs...)})
	require.NoError(t, err)
	require.NoError(t, e.ApplyTxn(txnID(1), DecisionCommit)) // stalls until a checkpoint
	e.mu.Lock()
	headroom = e.trig.headroom
	e.mu.Unlock()
	require.Equal(t, budget/2, headroom, "the apply's stall restores the half-cache trigger")
	require.Positive(t, e.stats.stallMaxNs.Load(), "the apply's stall is counted")
	require.Equal(t, uint64(0), s.get(t, uint64(pages)*logicpage.RowsPerPage))
	require.NoError(t, e.verify())
}
