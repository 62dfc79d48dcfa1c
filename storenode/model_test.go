package storenode

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math/bits"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/assert"
	"github.com/weftdb/weft/internal/testseed"
	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/logicpage"
)

// Model-based test: a random sequence of commits (inserts, updates, deletes over several pages
// of two tables with different row sizes), sparse reads, page-directory queries, retried
// batches, checkpoints, id and ownership grants, and reopens (clean Close, and kill -9 as
// FaultFS.CrashKeepAll), checked step by step against a map model. It runs with a tiny cache
// (MinCacheBytes: commits stall on checkpoints, pages of the 512-byte table do not even fit)
// and a larger one. The seed is printed; WEFT_SEED=<seed> replays it (the engine's background
// goroutines make IO timing vary, but the sequence of calls and their expected results do not).

func TestModel(t *testing.T) {
	seed, replay := testseed.Replay(t)
	if !replay {
		seed = uint64(time.Now().UnixNano())
	}
	for _, c := range []struct {
		name       string
		cacheBytes int64
	}{{"tiny", MinCacheBytes}, {"large", 8 << 20}} {
		t.Run("cache="+c.name, func(t *testing.T) {
			steps := testseed.Scaled(300, 1500, 20000)
			runModel(t, seed, c.cacheBytes, steps)
		})
	}
}

// modelRun is the state of one model run.
type modelRun struct {
	t      *testing.T
	rng    *rand.Rand
	fs     *vfs.FaultFS
	opts   Options
	e      *Engine
	m      *storeModel
	tables []*modelTable
	epochs map[uint32]uint64
	idsHi  map[uint32]uint64 // id high-water mark per table: every id below was granted
	seq    uint64
	sent   map[uint64]*base.Batch // the last batches applied, by seq, for identical retries
	lsns   map[uint64]uint64      // their LSNs
	gen    batchGen
	names  int      // scratch tables created, for their names
	trail  []string // the last steps, for the failure message
	seed   uint64
}

const modelOwner = 11

func runModel(t *testing.T, seed uint64, cacheBytes int64, steps int) {
	t.Logf("seed %d (replay with WEFT_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, uint64(cacheBytes)))
	clock := &fakeClock{}
	r := &modelRun{
		t:      t,
		rng:    rng,
		fs:     vfs.NewFaultFS(),
		m:      newStoreModel(),
		epochs: make(map[uint32]uint64),
		idsHi:  make(map[uint32]uint64),
		gen:    batchGen{rng: rng, pages: 12, segsMax: 4},
		seed:   seed,
	}
	r.opts = Options{
		Dir:                "db",
		FS:                 r.fs,
		Sync:               SyncMode(rng.IntN(2)),
		CacheBytes:         cacheBytes,
		CheckpointWALBytes: int64(8<<10) << rng.IntN(4),
		CheckpointInterval: -1,
		WALSegmentBytes:    int64(16<<10) << rng.IntN(3),
		Now:                clock.Now,
		Logger:             quietLogger,
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %d; last steps:\n%s", seed, strings.Join(r.trail, "\n"))
		}
		if r.e != nil {
			r.e.Close()
		}
	})
	var err error
	r.e, err = Open(r.opts)
	require.NoError(t, err)
	for _, spec := range []struct {
		name     string
		rowBytes int
	}{{"small", 24}, {"large", 512}} {
		info, err := r.e.CreateTable(spec.name, spec.rowBytes)
		require.NoError(t, err)
		r.tables = append(r.tables, r.m.addTable(info.ID, spec.rowBytes))
	}
	r.acquireAll()
	for _, mt := range r.tables {
		r.idsHi[mt.id] = requireGranted(t, r.e, mt.id, modelOwner, r.epochs[mt.id])
	}

	for step := range steps {
		switch p := rng.IntN(100); {
		case p < 45:
			r.commit()
		case p < 50:
			r.retry()
		case p < 68:
			r.read()
		case p < 78:
			r.pageDir()
		case p < 83:
			r.note("checkpoint")
			require.NoError(t, r.e.Checkpoint(), r.where(step))
		case p < 86:
			r.reopen(false)
		case p < 89:
			r.reopen(true)
		case p < 93:
			r.allocIDs()
		case p < 95:
			r.renew()
		case p < 96:
			r.createOrDrop()
		default:
			r.note("check store")
			require.NoError(t, checkStore(r.e, r.m), r.where(step))
		}
		if assert.Invariants {
			require.NoError(t, r.e.verify(), r.where(step))
		}
	}
	require.NoError(t, checkStore(r.e, r.m))
	require.NoError(t, r.e.Close())
	r.e = nil
	r.e, err = Open(r.opts)
	require.NoError(t, err)
	require.NoError(t, checkStore(r.e, r.m))
}

func (r *modelRun) note(format string, args ...any) {
	r.trail = append(r.trail, fmt.Sprintf(format, args...))
	if len(r.trail) > 40 {
		r.trail = r.trail[len(r.trail)-40:]
	}
}

func (r *modelRun) where(step int) string { return fmt.Sprintf("seed %d step %d", r.seed, step) }

func (r *modelRun) acquireAll() {
	for _, mt := range r.tables {
		g, err := r.e.Acquire(mt.id, modelOwner, 0)
		require.NoError(r.t, err)
		require.Greater(r.t, g.Epoch, r.epochs[mt.id], "epochs never repeat")
		require.Equal(r.t, r.seq, g.LastSeq, "the owner's last applied seq")
		r.epochs[mt.id] = g.Epoch
	}
}

func (r *modelRun) commit() {
	r.seq++
	b := r.gen.next(modelOwner, r.seq, r.tables, r.epochs)
	r.note("commit seq %d: %s", r.seq, describeBatch(b))
	lsn, err := r.e.CommitWait(b)
	require.NoError(r.t, err)
	require.NotZero(r.t, lsn)
	r.m.apply(b)
	if r.sent == nil {
		r.sent, r.lsns = make(map[uint64]*base.Batch), make(map[uint64]uint64)
	}
	r.sent[r.seq], r.lsns[r.seq] = b, lsn
	delete(r.sent, r.seq-4)
	delete(r.lsns, r.seq-4)
	// The budget holds, except that one batch may overrun it by its own pages while
	// nothing else is dirty (a page of the 512-byte table alone is twice the tiny budget).
	overrun := int64(r.gen.segsMax) * (512*logicpage.RowsPerPage + frameOverheadBytes)
	require.LessOrEqual(r.t, r.e.Stats().CacheBytes, r.opts.CacheBytes+overrun, "cache budget")
}

// retry sends again one of the last batches: the identical batch is acknowledged with its own
// LSN and not applied; a different batch under its seq is rejected (ErrSeqReused) and not
// applied either.
func (r *modelRun) retry() {
	if r.seq == 0 {
		return
	}
	seq := r.seq - uint64(r.rng.IntN(int(min(r.seq, 3))))
	if b, ok := r.sent[seq]; ok && r.rng.IntN(3) != 0 {
		r.note("retry seq %d (identical)", seq)
		lsn, err := r.e.CommitWait(b)
		require.NoError(r.t, err)
		require.Equal(r.t, r.lsns[seq], lsn, "a retried batch is acknowledged with its own LSN")
		return
	}
	b := r.gen.next(modelOwner, seq, r.tables, r.epochs)
	r.note("retry seq %d (other bytes)", b.Seq)
	_, err := r.e.CommitWait(b)
	require.Error(r.t, err)
	if _, ok := r.sent[seq]; ok {
		require.ErrorIs(r.t, err, ErrSeqReused)
	} else {
		// Applied before this run's window of kept batches: rejected either way.
		require.True(r.t, errors.Is(err, ErrSeqReused) || errors.Is(err, ErrUnknownOutcome), "%v", err)
	}
}

func (r *modelRun) read() {
	mt := r.tables[r.rng.IntN(len(r.tables))]
	page := r.rng.Uint64N(r.gen.pages + 2)
	want := r.rng.Uint64()
	if r.rng.IntN(3) == 0 {
		want = ^uint64(0)
	}
	r.note("read table %d page %d want %#x", mt.id, page, want)
	prefix := []byte("prefix")
	data, clr, out, err := r.e.ReadRows(mt.id, page, want, prefix)
	require.NoError(r.t, err)
	var present uint64
	base := page * logicpage.RowsPerPage
	for s := range 64 {
		if _, ok := mt.rows[base+uint64(s)]; ok {
			present |= 1 << s
		}
	}
	require.Equal(r.t, want&present, data, "read data mask")
	require.Equal(r.t, want&^present, clr, "read clear mask")
	require.Equal(r.t, prefix, out[:len(prefix)], "ReadRows appends to dst")
	out = out[len(prefix):]
	require.Len(r.t, out, bits.OnesCount64(data)*mt.rowBytes)
	k := 0
	for d := data; d != 0; d &= d - 1 {
		id := base + uint64(bits.TrailingZeros64(d))
		if !bytes.Equal(mt.rows[id], out[k*mt.rowBytes:(k+1)*mt.rowBytes]) {
			r.t.Fatalf("table %d row %d: wrong bytes", mt.id, id)
		}
		k++
	}
}

func (r *modelRun) pageDir() {
	mt := r.tables[r.rng.IntN(len(r.tables))]
	lo := r.rng.Uint64N(r.gen.pages + 1)
	hi := lo + r.rng.Uint64N(r.gen.pages+2)
	limit := 1 + r.rng.IntN(6)
	r.note("page dir table %d [%d, %d) max %d", mt.id, lo, hi, limit)
	got, next, err := r.e.PageDir(mt.id, lo, hi, limit, nil)
	require.NoError(r.t, err)
	pages := mt.pages()
	var want []PageInfo
	for _, p := range slices.Sorted(maps.Keys(pages)) {
		if p >= lo && p < hi {
			want = append(want, PageInfo{Page: p, Present: pages[p]})
		}
	}
	wantNext := hi
	if len(want) >= limit {
		want = want[:limit]
		wantNext = min(want[limit-1].Page+1, hi)
	}
	if len(want) == 0 {
		want = nil
	}
	require.Equal(r.t, want, got, "page directory")
	require.Equal(r.t, wantNext, next, "page directory continuation")
}

// reopen closes the engine (cleanly, or as kill -9: nothing written after the kill, every
// written byte kept) and opens it again.
func (r *modelRun) reopen(kill bool) {
	if kill {
		r.note("kill -9 and reopen")
		r.fs.SetCrashPoint(0) // the dead process writes nothing more
		r.e.Close()
		r.fs.CrashKeepAll()
	} else {
		r.note("close and reopen")
		require.NoError(r.t, r.e.Close())
	}
	r.e = nil
	e, err := Open(r.opts)
	require.NoError(r.t, err)
	r.e = e
	require.NoError(r.t, checkStore(r.e, r.m))
	r.requireTables()
	for _, mt := range r.tables {
		info := tableInfo(r.t, r.e, mt.id)
		require.Equal(r.t, r.idsHi[mt.id], info.NextID, "id high-water mark survives")
	}
	r.acquireAll()
}

func (r *modelRun) allocIDs() {
	mt := r.tables[r.rng.IntN(len(r.tables))]
	pages := 1 + r.rng.IntN(3)
	r.note("alloc %d id pages of table %d", pages, mt.id)
	first, n, err := r.e.AllocIDs(mt.id, modelOwner, r.epochs[mt.id], pages)
	require.NoError(r.t, err)
	require.Equal(r.t, r.idsHi[mt.id], first, "ids are granted in order, never twice")
	require.Equal(r.t, uint64(pages*64), n)
	r.idsHi[mt.id] = first + n
}

// renew renews a grant with its epoch, or asks for a new one (the epoch goes up).
func (r *modelRun) renew() {
	mt := r.tables[r.rng.IntN(len(r.tables))]
	if r.rng.IntN(2) == 0 {
		r.note("renew table %d epoch %d", mt.id, r.epochs[mt.id])
		g, err := r.e.Acquire(mt.id, modelOwner, r.epochs[mt.id])
		require.NoError(r.t, err)
		require.Equal(r.t, r.epochs[mt.id], g.Epoch)
		return
	}
	r.note("regrant table %d", mt.id)
	g, err := r.e.Acquire(mt.id, modelOwner, 0)
	require.NoError(r.t, err)
	require.Greater(r.t, g.Epoch, r.epochs[mt.id])
	old := r.epochs[mt.id]
	r.epochs[mt.id] = g.Epoch
	// The old epoch is fenced now.
	b := &base.Batch{Owner: modelOwner, Seq: r.seq + 1, Fences: []base.Fence{{Table: mt.id, Epoch: old}},
		Segments: []base.Segment{{Table: mt.id, Page: 0, Clear: 1}}}
	_, err = r.e.CommitWait(b)
	require.ErrorIs(r.t, err, ErrFenced)
}

// createOrDrop drops the scratch table if there is one (its name may come back, its id never
// does), else creates one; the committers write it while it lives.
func (r *modelRun) createOrDrop() {
	if len(r.tables) > 2 {
		mt := r.tables[2]
		name := fmt.Sprintf("scratch%d", r.names%2)
		r.note("drop table %d %s", mt.id, name)
		require.NoError(r.t, r.e.DropTable(name, modelOwner))
		r.tables = r.tables[:2]
		delete(r.m.tables, mt.id)
		delete(r.epochs, mt.id)
		_, err := r.e.OpenTable(name)
		require.ErrorIs(r.t, err, ErrTableNotFound)
		_, _, _, err = r.e.ReadRows(mt.id, 0, 1, nil)
		require.ErrorIs(r.t, err, ErrTableNotFound)
		r.requireTables()
		return
	}
	r.names++
	name := fmt.Sprintf("scratch%d", r.names%2)
	rowBytes := []int{8, 64, 128}[r.rng.IntN(3)]
	r.note("create table %s rows of %d bytes", name, rowBytes)
	info, err := r.e.CreateTable(name, rowBytes)
	require.NoError(r.t, err)
	for _, mt := range r.tables {
		require.Greater(r.t, info.ID, mt.id, "table ids are never reused")
	}
	r.tables = append(r.tables, r.m.addTable(info.ID, rowBytes))
	g, err := r.e.Acquire(info.ID, modelOwner, 0)
	require.NoError(r.t, err)
	r.epochs[info.ID] = g.Epoch
	r.idsHi[info.ID] = requireGranted(r.t, r.e, info.ID, modelOwner, g.Epoch)
	r.requireTables()
}

// requireTables checks that the engine lists exactly the model's tables.
func (r *modelRun) requireTables() {
	var ids []uint32
	for _, ti := range r.e.Tables() {
		ids = append(ids, ti.ID)
	}
	require.Equal(r.t, slices.Sorted(maps.Keys(r.m.tables)), ids, "tables")
}

func tableInfo(t testing.TB, e *Engine, id uint32) base.TableInfo {
	t.Helper()
	for _, ti := range e.Tables() {
		if ti.ID == id {
			return ti
		}
	}
	t.Fatalf("table %d missing", id)
	return base.TableInfo{}
}

func describeBatch(b *base.Batch) string {
	var sb strings.Builder
	for i, s := range b.Segments {
		if i > 0 {
			sb.WriteString(", ")
		}
		fmt.Fprintf(&sb, "t%d/p%d d%#x c%#x", s.Table, s.Page, s.Data, s.Clear)
	}
	return sb.String()
}
