package storenode

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/vfs"
)

// Crash points. A deterministic workload (one goroutine, each call waited for) of table
// creations, grants, commits, checkpoints (which delete WAL segments) and a clean reopen makes
// about 300 mutating IO operations. It is run once to count them, then once for every k: the
// first k operations run, every later one fails as if the process had died there, and then the
// power is cut with Crash(rng) (even k) or CrashPartialEntries(rng) (odd k). Open must then
// succeed (nothing in this workload justifies a corruption error) and the store must match the
// model: every acknowledged batch, table and grant is there, the one batch in flight is whole
// or absent, no id or epoch is granted twice.

const crashPointOwner = 3

// crashPointRun is one run of the workload and what it had acknowledged when it stopped.
type crashPointRun struct {
	fs     *vfs.FaultFS
	opts   Options
	e      *Engine
	gen    batchGen
	m      *storeModel // acknowledged tables; rows are applied from batches by seq
	tables []*modelTable
	epochs map[uint32]uint64
	idsHi  map[uint32]uint64

	batches  map[uint64]*base.Batch
	issued   uint64
	acked    uint64
	dropping uint32 // a table whose drop was sent but not acknowledged
	dropped  []uint32

	logAppends, logCompactions uint64 // of the engines closed by reopen
}

func newCrashPointRun(fs *vfs.FaultFS) *crashPointRun {
	return &crashPointRun{
		fs: fs,
		opts: Options{
			Dir:                "db",
			FS:                 fs,
			Sync:               SyncAlways,
			CacheBytes:         1 << 20, // no background checkpoint: the IO sequence is fixed
			CheckpointWALBytes: -1,
			CheckpointInterval: -1,
			WALSegmentBytes:    4 << 10,
			Logger:             quietLogger,
		},
		gen:     batchGen{rng: rand.New(rand.NewPCG(1, 2)), pages: 6, segsMax: 3},
		m:       newStoreModel(),
		epochs:  make(map[uint32]uint64),
		idsHi:   make(map[uint32]uint64),
		batches: make(map[uint64]*base.Batch),
	}
}

// workload runs until the first error (the crash point) or its end.
func (r *crashPointRun) workload() error {
	var err error
	if r.e, err = Open(r.opts); err != nil {
		return err
	}
	r.e.ckptChunk = reviewChunks // every checkpoint crosses chunk boundaries
	r.e.logSlack = 0             // the map log compacts often: every step of it is a crash point
	steps := []func() error{
		func() error { return r.createTable("a", 64) },
		func() error { return r.allocIDs(0, 4) },
		func() error { return r.commits(12) },
		r.e.Checkpoint,
		func() error { return r.createTable("b", 512) },
		func() error { return r.commits(10) },
		func() error { return r.createTable("c", 8) },
		func() error { return r.commits(4) },
		func() error { return r.dropTable("c") },
		func() error { return r.allocIDs(1, 2) },
		func() error { return r.checkpoint() },
		func() error { return r.commits(6) },
		r.reopen,
		func() error { return r.commits(10) },
		func() error { return r.allocIDs(0, 1) },
		func() error { return r.checkpoint() },
		func() error { return r.commits(6) },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// checkpoint checkpoints through the engine opened last (reopen replaces it).
func (r *crashPointRun) checkpoint() error { return r.e.Checkpoint() }

func (r *crashPointRun) createTable(name string, rowBytes int) error {
	info, err := r.e.CreateTable(name, rowBytes)
	if err != nil {
		return err
	}
	mt := r.m.addTable(info.ID, rowBytes)
	g, err := r.e.Acquire(info.ID, crashPointOwner, 0)
	if err != nil {
		return err
	}
	r.epochs[info.ID] = g.Epoch
	next, err := grantPages(r.e, info.ID, crashPointOwner, g.Epoch, testGrantPages)
	if err != nil {
		return err
	}
	r.idsHi[info.ID] = next
	r.tables = append(r.tables, mt)
	return nil
}

func (r *crashPointRun) dropTable(name string) error {
	mt := r.tables[len(r.tables)-1]
	r.dropping = mt.id
	if err := r.e.DropTable(name, crashPointOwner); err != nil {
		return err
	}
	r.dropping = 0
	r.dropped = append(r.dropped, mt.id)
	r.tables = r.tables[:len(r.tables)-1]
	delete(r.m.tables, mt.id)
	return nil
}

func (r *crashPointRun) allocIDs(table, pages int) error {
	mt := r.tables[table]
	first, n, err := r.e.AllocIDs(mt.id, crashPointOwner, r.epochs[mt.id], pages)
	if err != nil {
		return err
	}
	if first < r.idsHi[mt.id] {
		return fmt.Errorf("table %d: id %d granted twice", mt.id, first)
	}
	r.idsHi[mt.id] = first + n
	return nil
}

func (r *crashPointRun) commits(n int) error {
	for range n {
		r.issued++
		b := r.gen.next(crashPointOwner, r.issued, r.tables, r.epochs)
		r.batches[r.issued] = b
		if _, err := r.e.CommitWait(b); err != nil {
			return err
		}
		r.acked = r.issued
	}
	return nil
}

func (r *crashPointRun) reopen() error {
	r.logAppends += r.e.stats.mapLogAppends.Load()
	r.logCompactions += r.e.stats.mapLogCompactions.Load()
	if err := r.e.Close(); err != nil {
		return err
	}
	var err error
	if r.e, err = Open(r.opts); err != nil {
		return err
	}
	r.e.ckptChunk = reviewChunks
	r.e.logSlack = 0
	for _, mt := range r.tables {
		g, err := r.e.Acquire(mt.id, crashPointOwner, 0)
		if err != nil {
			return err
		}
		r.epochs[mt.id] = g.Epoch
	}
	return nil
}

// checkRecovered opens the store after the crash and compares it with what r acknowledged.
func (r *crashPointRun) checkRecovered(t *testing.T, msg string) {
	requireCheckNoDamage(t, r.opts.FS, r.opts.Dir, msg+": check")
	e, err := Open(r.opts)
	require.NoError(t, err, "%s: open", msg)
	defer e.Close()
	want := r.m.clone()
	exists := make(map[uint32]bool)
	for _, ti := range e.Tables() {
		exists[ti.ID] = true
	}
	for _, id := range r.dropped {
		require.False(t, exists[id], "%s: dropped table %d is back", msg, id)
	}
	var c uint64
	for _, mt := range r.tables {
		if mt.id == r.dropping && !exists[mt.id] {
			delete(want.tables, mt.id) // the drop was not acknowledged, but it happened
			continue
		}
		info := tableInfo(t, e, mt.id)
		require.GreaterOrEqual(t, info.NextID, r.idsHi[mt.id], "%s: table %d ids", msg, mt.id)
		g, err := e.Acquire(mt.id, crashPointOwner, 0)
		require.NoError(t, err, msg)
		require.Greater(t, g.Epoch, r.epochs[mt.id], "%s: table %d: epoch granted twice", msg, mt.id)
		c = g.LastSeq
		first, _, err := e.AllocIDs(mt.id, crashPointOwner, g.Epoch, 1)
		require.NoError(t, err, msg)
		require.GreaterOrEqual(t, first, r.idsHi[mt.id], "%s: table %d: id granted twice", msg, mt.id)
	}
	require.GreaterOrEqual(t, c, r.acked, "%s: acknowledged batch lost", msg)
	require.LessOrEqual(t, c, r.issued, "%s: batch never sent was applied", msg)
	for seq := uint64(1); seq <= c; seq++ {
		want.apply(r.batches[seq])
	}
	require.NoError(t, checkStore(e, want), "%s: recovered seq %d (acknowledged %d, sent %d)", msg, c, r.acked, r.issued)
}

func TestCrashPoints(t *testing.T) {
	// Count the workload's operations.
	full := newCrashPointRun(vfs.NewFaultFS())
	require.NoError(t, full.workload())
	total := full.fs.Ops()
	require.NoError(t, full.e.Close())
	t.Logf("workload: %d mutating IO operations, %d batches", total, full.issued)
	require.Greater(t, total, int64(200))
	appends := full.logAppends + full.e.stats.mapLogAppends.Load()
	compactions := full.logCompactions + full.e.stats.mapLogCompactions.Load()
	t.Logf("map log: %d appends, %d compactions (each a new log, the old one removed)", appends, compactions)
	require.Greater(t, appends, uint64(0), "the workload appends to the map log")
	require.Greater(t, compactions, uint64(1), "the workload compacts the map log")
	full.checkRecovered(t, "no crash")

	step := int64(1)
	if testing.Short() {
		step = 7
	}
	for k := int64(0); k <= total; k += step {
		r := newCrashPointRun(vfs.NewFaultFS())
		r.fs.SetCrashPoint(k)
		err := r.workload()
		if k < total {
			require.Error(t, err, "crash point %d: the workload went on", k)
		}
		require.True(t, r.fs.CrashPointReached() || k == total, "crash point %d: %v", k, err)
		if r.e != nil {
			r.e.Close()
		}
		rng := rand.New(rand.NewPCG(uint64(k), 77))
		if k%2 == 0 {
			r.fs.Crash(rng)
		} else {
			r.fs.CrashPartialEntries(rng)
		}
		r.checkRecovered(t, fmt.Sprintf("crash point %d of %d (last error: %v)", k, total, err))
		if t.Failed() {
			return
		}
	}
}
