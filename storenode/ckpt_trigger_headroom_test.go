package storenode

import (
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/logicpage"
)

// The page index's nodes count against the cache budget beside the frames, so the room a
// checkpoint has is the budget less the dirty frames and the index they need, not the budget
// less the dirty frames alone. Pages one per 1,024-page range cost a 4 KiB leaf each: the index
// of a dirty set of them is about half the cache, the dirty frames can never reach 7/8 (or
// even half) of it, and a trigger that ignored the index never fired: every checkpoint was a
// commit stalling on a cache full of dirty pages. Sequential commits, no WAL or time trigger:
// a checkpoint runs only when the cache trigger asks for one (or a stalled commit does), and
// the test stops at the first checkpoint or at the first commit after which the room is below
// the headroom, which must have asked.
func TestCacheTriggerCountsIndexBytes(t *testing.T) {
	const frames = 64
	cost := int64(4096 + frameOverheadBytes)
	e, err := Open(Options{Dir: "db", FS: vfs.NewFaultFS(), Logger: quietLogger, Sync: SyncNone,
		CheckpointInterval: -1, CheckpointWALBytes: -1, CacheBytes: frames * cost})
	require.NoError(t, err)
	defer e.Close()
	info, err := e.CreateTable("t", 64)
	require.NoError(t, err)
	g := acquire(t, e, info.ID, testOwner, 0)
	_, err = grantPages(e, info.ID, testOwner, g.Epoch, frames*pixFan)
	require.NoError(t, err)
	e.mu.Lock()
	budget := e.cache.budgetBytes
	e.trig.headroom = budget / 8 // as a checkpoint of a cached table measures it
	e.mu.Unlock()
	for k := range uint64(frames) {
		id := k * pixFan * logicpage.RowsPerPage
		commitWait(t, e, batchOf(testOwner, k+1, info.ID, g.Epoch, oneRow(info.ID, id, row64(k))))
		e.mu.Lock()
		index := e.cache.index.bytes
		room := budget - e.cache.dirtyBytes - index
		pressure, stalled, ckpts := e.cachePressure(), e.stats.stallMaxNs.Load(), e.stats.checkpoints.Load()
		e.mu.Unlock()
		require.Zero(t, stalled, "commit %d stalled for room before the trigger fired", k)
		if ckpts > 0 {
			return // only the cache trigger starts one here, and it did before any stall
		}
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
// (Updates beside the checkpoints, commitsBesideCheckpoints: one with nothing committed beside
// it measures nothing.)
func TestCacheTriggerTxnApplyStall(t *testing.T) {
	const pages, txnPages = 48, 34
	cost := int64(4096 + frameOverheadBytes)
	fs := vfs.NewFaultFS()
	e := openTest(t, Options{Dir: "db", FS: fs, Logger: quietLogger, Sync: SyncNone,
		CheckpointInterval: -1, CheckpointWALBytes: -1, TxnResolveInterval: -1, CacheBytes: 80 * cost})
	beside := commitsBesideCheckpoints(t, fs, e)
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
	beside.start()
	pass(2)
	require.NoError(t, e.Checkpoint())
	beside.stop()
	pass(3)
	e.mu.Lock()
	budget, headroom, pressure := e.cache.budgetBytes, e.trig.headroom, e.cachePressure()
	e.mu.Unlock()
	require.Equal(t, budget/8, headroom)
	require.False(t, pressure)

	segs := make([]base.Segment, txnPages)
	for i := range segs {
		segs[i] = oneRow(s.table, uint64(pages+i)*logicpage.RowsPerPage, row64(uint64(i)))
	}
	_, err = e.PrepareTxn(&base.TxnPrepare{Txn: txnID(1), Lease: 9, Batch: s.batch(segs...)})
	require.NoError(t, err)
	require.NoError(t, e.ApplyTxn(txnID(1), base.DecisionCommit)) // stalls until a checkpoint
	e.mu.Lock()
	headroom = e.trig.headroom
	e.mu.Unlock()
	require.Equal(t, budget/2, headroom, "the apply's stall restores the half-cache trigger")
	require.Positive(t, e.stats.stallMaxNs.Load(), "the apply's stall is counted")
	require.Equal(t, uint64(0), s.get(t, uint64(pages)*logicpage.RowsPerPage))
	require.NoError(t, e.verify())
}

// besideCommits runs one commit, to a cached page of a table of its own, at each data-file
// sync of a checkpoint while started: the checkpoints then run beside commits that allocate
// no frame, as a cached table's updates do. Any goroutine may run a checkpoint meanwhile.
type besideCommits struct {
	t      testing.TB
	fs     *vfs.FaultFS
	e      *Engine
	table  uint32
	epoch  uint64
	mu     sync.Mutex
	on     bool
	seq, n uint64
	err    error
}

const besideOwner = testOwner + 100

func commitsBesideCheckpoints(t testing.TB, fs *vfs.FaultFS, e *Engine) *besideCommits {
	t.Helper()
	info, g := ownedTable(t, e, "beside", 64, besideOwner, 1)
	b := &besideCommits{t: t, fs: fs, e: e, table: info.ID, epoch: g.Epoch}
	b.on = true
	b.commit() // its frame is cached from here on
	require.NoError(t, b.err)
	b.on = false
	return b
}

func (b *besideCommits) commit() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.on {
		return
	}
	b.seq++
	_, err := b.e.CommitWait(batchOf(besideOwner, b.seq, b.table, b.epoch, oneRow(b.table, 0, row64(b.seq))))
	if err != nil && b.err == nil {
		b.err = err
	}
	b.n++
}

func (b *besideCommits) start() {
	b.mu.Lock()
	b.on, b.n = true, 0
	b.mu.Unlock()
	b.fs.Inject(func(op vfs.Op) error {
		if op.Kind == vfs.OpSync && strings.Contains(op.Name, "table-") {
			b.commit()
		}
		return nil
	})
}

// stop ends the commits and fails the test unless at least one ran, all of them applied.
func (b *besideCommits) stop() {
	b.t.Helper()
	b.fs.Inject(nil)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.on = false
	require.NoError(b.t, b.err)
	require.Positive(b.t, b.n, "no checkpoint ran while started")
}

// A checkpoint with nothing committed beside it (an idle moment's timer, a Checkpoint call,
// one beside a grant only) measured no commits, not commits that need no room: it keeps the headroom. Before, an idle
// checkpoint set the smallest headroom (1/8) whatever the last measured workload needed, and
// the next burst of inserts stalled behind a checkpoint of 7/8 of the cache.
func TestCacheTriggerIdleCheckpointKeepsHeadroom(t *testing.T) {
	cost := int64(4096 + frameOverheadBytes)
	fs := vfs.NewFaultFS()
	e := openTest(t, Options{Dir: "db", FS: fs, Logger: quietLogger, Sync: SyncNone,
		CheckpointInterval: -1, CheckpointWALBytes: -1, CacheBytes: 80 * cost})
	info, g := ownedTable(t, e, "t", 64, testOwner, 20)
	e.mu.Lock()
	budget := e.cache.budgetBytes
	e.trig.headroom = budget / 2 // as a checkpoint beside inserts measures it
	e.mu.Unlock()
	for p := range uint64(20) { // a quarter of the cache: no trigger
		commitWait(t, e, batchOf(testOwner, p+1, info.ID, g.Epoch, oneRow(info.ID, p*logicpage.RowsPerPage, row64(p))))
	}
	require.NoError(t, e.Checkpoint()) // nothing committed beside it
	e.mu.Lock()
	headroom := e.trig.headroom
	e.mu.Unlock()
	require.Equal(t, budget/2, headroom, "an idle checkpoint keeps the measured headroom")

	// A grant logged beside the checkpoint is no commit either.
	for p := range uint64(20) { // the cached pages again: no allocation
		commitWait(t, e, batchOf(testOwner, 21+p, info.ID, g.Epoch, oneRow(info.ID, p*logicpage.RowsPerPage, row64(p+1))))
	}
	var once sync.Once
	var grantErr error
	fs.Inject(func(op vfs.Op) error {
		if op.Kind == vfs.OpSync && strings.Contains(op.Name, "table-") {
			once.Do(func() { _, _, grantErr = e.AllocIDs(info.ID, testOwner, g.Epoch, 1) })
		}
		return nil
	})
	require.NoError(t, e.Checkpoint())
	fs.Inject(nil)
	require.NoError(t, grantErr)
	e.mu.Lock()
	headroom = e.trig.headroom
	e.mu.Unlock()
	require.Equal(t, budget/2, headroom, "a checkpoint beside a grant only keeps the measured headroom")
}

// Checkpoints inside replay run with no commit beside them: recovery leaves the half-cache
// trigger of a store that has measured nothing yet, not the 1/8 of a measurement of nothing.
func TestCacheTriggerReplayCheckpointKeepsHeadroom(t *testing.T) {
	cost := int64(4096 + frameOverheadBytes)
	fs := vfs.NewFaultFS()
	opts := Options{Dir: "db", FS: fs, Logger: quietLogger, Sync: SyncNone,
		CheckpointInterval: -1, CheckpointWALBytes: -1, CacheBytes: 256 * cost}
	e := openEngine(t, opts)
	info, err := e.CreateTable("t", 64)
	require.NoError(t, err)
	g := acquire(t, e, info.ID, testOwner, 0)
	const pages = 60 // under half the first cache, over the second
	_, err = grantPages(e, info.ID, testOwner, g.Epoch, pages)
	require.NoError(t, err)
	for p := range uint64(pages) {
		commitWait(t, e, batchOf(testOwner, p+1, info.ID, g.Epoch, oneRow(info.ID, p*logicpage.RowsPerPage, row64(p))))
	}
	// Stop without a checkpoint: a failed checkpoint write makes the engine fail-stop, so
	// Close publishes nothing and the WAL holds every commit.
	fs.SetFailAt(vfs.OpWrite, 1, nil)
	require.Error(t, e.Checkpoint())
	e.Close()
	fs.ResetFaults()
	fs.CrashKeepAll()

	opts.CacheBytes = 32 * cost
	e2 := openEngine(t, opts)
	defer e2.Close()
	require.Positive(t, e2.Stats().Checkpoints, "replay checkpointed")
	e2.mu.Lock()
	headroom := e2.trig.headroom
	e2.mu.Unlock()
	require.Zero(t, headroom, "half the cache until a checkpoint beside commits measures one")
	for p := range uint64(pages) {
		got, ok := readRow(t, e2, info.ID, p*logicpage.RowsPerPage)
		require.True(t, ok)
		require.Equal(t, row64(p), got)
	}
}
