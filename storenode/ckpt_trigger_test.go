package storenode

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/logicpage"
)

// A cache that holds its table lets random updates dirty more than half of it without a
// checkpoint once a checkpoint has measured that commits allocate no frames while it runs (the
// old half-cache trigger rewrote the whole table every time the dirty set passed half the
// cache). Sequential commits, background checkpoints on: whichever of them run, every
// checkpoint that ends after the first pass has commits beside it (commitsBesideCheckpoints)
// and no allocation.
func TestCacheTriggerLetsHeldTableGrowDirty(t *testing.T) {
	const pages = 48
	cost := int64(4096 + frameOverheadBytes)
	fs := vfs.NewFaultFS()
	e, err := Open(Options{Dir: "db", FS: fs, Logger: quietLogger, Sync: SyncNone,
		CheckpointInterval: -1, CheckpointWALBytes: -1, CacheBytes: 80 * cost})
	require.NoError(t, err)
	defer e.Close()
	beside := commitsBesideCheckpoints(t, fs, e)
	info, g := ownedTable(t, e, "t", 64, testOwner, pages)
	var seq uint64
	pass := func(version uint64) {
		row := make([]byte, 64)
		for p := range uint64(pages) {
			id := p * logicpage.RowsPerPage
			binary.LittleEndian.PutUint64(row, id)
			binary.LittleEndian.PutUint64(row[8:], version)
			seq++
			commitWait(t, e, batchOf(testOwner, seq, info.ID, g.Epoch, oneRow(info.ID, id, row)))
		}
	}
	pass(1) // allocates every frame
	require.NoError(t, e.Checkpoint())
	beside.start() // a commit beside each checkpoint from here on: they measure commits
	pass(2)        // no allocation: the table is cached
	require.NoError(t, e.Checkpoint())
	beside.stop()
	pass(3)
	e.mu.Lock()
	dirty, budget, pressure, headroom := e.cache.dirtyBytes, e.cache.budgetBytes, e.cachePressure(), e.trig.headroom
	e.mu.Unlock()
	require.Equal(t, budget/8, headroom)
	require.Greater(t, dirty*2, budget, "the dirty set passed the old half-cache trigger")
	require.False(t, pressure, "no checkpoint needed: the cache has room for 7/8 of it dirty")
	for p := range uint64(pages) {
		got, ok := readRow(t, e, info.ID, p*logicpage.RowsPerPage)
		require.True(t, ok)
		require.Equal(t, uint64(3), binary.LittleEndian.Uint64(got[8:]))
	}
	require.NoError(t, e.verify())
}

// endTrigger's headroom: budget*2r/(1+2r) for r frame bytes allocated per dirty byte written,
// clamped to [budget/8, budget/2]; half after a stall; unchanged when too little was written.
func TestCacheTriggerHeadroom(t *testing.T) {
	const budget = 64 << 20
	e := &Engine{cache: newPageCache(budget)}
	e.stats.rowsWritten.Store(1) // rows committed beside each checkpoint
	end := func(alloc, dirty int64, stalled bool) int64 {
		e.trig.allocStart, e.trig.dirtyStart, e.trig.stalled = 1000, dirty, stalled
		e.cache.allocBytes = 1000 + alloc
		e.trig.dirtiedAt, e.cache.dirtiedBytes = 5000, 5000+alloc
		e.endTrigger()
		require.False(t, e.trig.stalled, "a stall counts for one checkpoint")
		return e.trig.headroom
	}
	require.Equal(t, int64(0), e.trig.headroom, "half the cache before the first checkpoint")
	require.False(t, func() bool { e.cache.dirtyBytes = budget/2 - 1; return e.cachePressure() }())
	require.True(t, func() bool { e.cache.dirtyBytes = budget/2 + 1; return e.cachePressure() }())
	require.Equal(t, int64(budget/8), end(0, 32<<20, false))
	require.Equal(t, int64(budget/2), end(32<<20, 32<<20, false), "r=1 asks for 2/3: clamped to half")
	require.Equal(t, int64(budget*2/10), end(4<<20, 32<<20, false), "r=1/8: 2r/(1+2r) = 1/5")
	require.Equal(t, int64(budget/2), end(0, 32<<20, true), "a stall restores the half-cache trigger")
	require.Equal(t, int64(budget/2), end(0, budget/64-1, false), "too little written: kept")
	// Pages turned dirty count once allocations are material (1/64 of the bytes written).
	e.trig.allocStart, e.cache.allocBytes, e.trig.dirtyStart = 0, 1<<20, 32<<20
	e.trig.dirtiedAt, e.cache.dirtiedBytes = 0, 4<<20
	e.endTrigger()
	require.Equal(t, int64(budget*2/10), e.trig.headroom, "dirtied 4 MiB per 32 written: r=1/8")
	e.trig.allocStart, e.cache.allocBytes, e.trig.dirtyStart = 0, 1<<10, 32<<20
	e.trig.dirtiedAt, e.cache.dirtiedBytes = 0, 16<<20
	e.endTrigger()
	require.Equal(t, int64(budget/8), e.trig.headroom, "without allocations dirtying stalls nothing")
	require.Equal(t, int64(budget/8), end(0, 32<<20, false))
	// A checkpoint with nothing committed beside it measured nothing: the headroom stays.
	e.trig.rowsStart = e.stats.rowsWritten.Load()
	require.Equal(t, int64(budget/8), end(32<<20, 32<<20, false), "idle: kept")
	require.Equal(t, int64(budget/2), end(0, 32<<20, true), "idle, but a commit stalled")
	e.trig.rowsStart = 0
	require.Equal(t, int64(budget/8), end(0, 32<<20, false))
	e.cache.dirtyBytes = budget - budget/2 + 1
	require.False(t, e.cachePressure())
	e.cache.dirtyBytes = budget - budget/8 + 1
	require.True(t, e.cachePressure(), "7/8 of the cache dirty always starts one")
}
