package storenode

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/testkit"
	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/logicpage"
)

const testOwner = 7

// openTest opens an engine in a fresh temporary directory on the OS file system.
func openTest(t testing.TB, opts Options) *Engine {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	e := openEngine(t, opts)
	t.Cleanup(func() { e.Close() })
	return e
}

// openEngine opens an engine with opts, failing the test on error; the caller closes it.
func openEngine(t testing.TB, opts Options) *Engine {
	t.Helper()
	e, err := Open(opts)
	require.NoError(t, err)
	return e
}

// acquire grants owner table in e (Engine.Acquire: epoch 0 for a new grant, else a renewal),
// failing the test on error.
func acquire(t testing.TB, e *Engine, table uint32, owner, epoch uint64) base.Grant {
	t.Helper()
	g, err := e.Acquire(table, owner, epoch)
	require.NoError(t, err)
	return g
}

// commitWait commits b to e and waits for it to be durable, failing the test on error, and
// returns its LSN.
func commitWait(t testing.TB, e *Engine, b *base.Batch) uint64 {
	t.Helper()
	lsn, err := e.CommitWait(b)
	require.NoError(t, err)
	return lsn
}

// row64 is testkit.Row64: the words of the row are v, v+1, ...
func row64(v uint64) []byte { return testkit.Row64(v) }

// ownedTable creates a table of rowBytes-byte rows in e, takes a new grant of it for owner and
// grants that owner the ids of the table's first pages pages.
func ownedTable(t testing.TB, e *Engine, name string, rowBytes int, owner uint64, pages int) (base.TableInfo, base.Grant) {
	t.Helper()
	ti, err := e.CreateTable(name, rowBytes)
	require.NoError(t, err)
	g := acquire(t, e, ti.ID, owner, 0)
	_, _, err = e.AllocIDs(ti.ID, owner, g.Epoch, pages)
	require.NoError(t, err)
	return ti, g
}

func oneRow(table uint32, id uint64, row []byte) base.Segment {
	page, slot := logicpage.PageOf(id)
	return base.Segment{Table: table, Page: page, Data: 1 << slot, Rows: row}
}

func deleteRow(table uint32, id uint64) base.Segment {
	page, slot := logicpage.PageOf(id)
	return base.Segment{Table: table, Page: page, Clear: 1 << slot}
}

func readRow(t testing.TB, e *Engine, table uint32, id uint64) ([]byte, bool) {
	t.Helper()
	page, slot := logicpage.PageOf(id)
	data, clr, out, err := e.ReadRows(table, page, 1<<slot, nil)
	require.NoError(t, err)
	require.Equal(t, uint64(1<<slot), data|clr)
	return out, data != 0
}

func TestCommitReadCheckpointReopen(t *testing.T) {
	dir := t.TempDir()
	e := openTest(t, Options{Dir: dir})
	info, err := e.CreateTable("items", 64)
	require.NoError(t, err)
	require.Equal(t, uint32(1), info.ID)
	g := acquire(t, e, info.ID, testOwner, 0)
	require.Equal(t, uint64(1), g.Epoch)
	first, n, err := e.AllocIDs(info.ID, testOwner, g.Epoch, 2)
	require.NoError(t, err)
	require.Equal(t, uint64(0), first)
	require.Equal(t, uint64(128), n)

	fences := []base.Fence{{Table: info.ID, Epoch: g.Epoch}}
	for seq := uint64(1); seq <= 100; seq++ {
		commitWait(t, e, &base.Batch{Owner: testOwner, Seq: seq, Fences: fences,
			Segments: []base.Segment{oneRow(info.ID, seq, row64(seq*100))}})
	}
	commitWait(t, e, &base.Batch{Owner: testOwner, Seq: 101, Fences: fences, Segments: []base.Segment{deleteRow(info.ID, 50)}})

	check := func(e *Engine) {
		for id := uint64(1); id <= 100; id++ {
			row, ok := readRow(t, e, info.ID, id)
			if id == 50 {
				require.False(t, ok)
				continue
			}
			require.True(t, ok, "row %d", id)
			require.Equal(t, row64(id*100), row, "row %d", id)
		}
		_, ok := readRow(t, e, info.ID, 0)
		require.False(t, ok)
	}
	check(e)
	require.NoError(t, e.Checkpoint())
	check(e)
	lsn102 := commitWait(t, e, &base.Batch{Owner: testOwner, Seq: 102, Fences: fences, Segments: []base.Segment{oneRow(info.ID, 7, row64(7*100))}})
	require.NoError(t, e.Close())

	e2 := openTest(t, Options{Dir: dir})
	check(e2)
	tabs := e2.Tables()
	require.Len(t, tabs, 1)
	require.Equal(t, uint64(128), tabs[0].NextID)
	require.Equal(t, uint64(99), tabs[0].Rows)
	// The owner's seq survived: a different batch under an applied seq is rejected, not
	// applied; the identical one is acknowledged again with its own LSN.
	_, err = e2.CommitWait(&base.Batch{Owner: testOwner, Seq: 101, Fences: fences, Segments: []base.Segment{oneRow(info.ID, 1, row64(0))}})
	require.ErrorIs(t, err, ErrSeqReused)
	require.ErrorIs(t, err, ErrFenced, "on the wire: fenced")
	lsn := commitWait(t, e2, &base.Batch{Owner: testOwner, Seq: 102, Fences: fences, Segments: []base.Segment{oneRow(info.ID, 7, row64(7*100))}})
	require.Equal(t, lsn102, lsn)
	row, _ := readRow(t, e2, info.ID, 1)
	require.Equal(t, row64(100), row)
}

func TestTinyCacheManyPages(t *testing.T) {
	dir := t.TempDir()
	e := openTest(t, Options{Dir: dir, CacheBytes: MinCacheBytes})
	const n = 2000
	info, g := ownedTable(t, e, "t", 64, testOwner, n)
	fences := []base.Fence{{Table: info.ID, Epoch: g.Epoch}}
	for seq := uint64(1); seq <= n; seq++ {
		id := seq * 37 % (n * 64)
		commitWait(t, e, &base.Batch{Owner: testOwner, Seq: seq, Fences: fences, Segments: []base.Segment{oneRow(info.ID, id, row64(id))}})
	}
	verify := func(e *Engine) {
		for seq := uint64(1); seq <= n; seq++ {
			id := seq * 37 % (n * 64)
			row, ok := readRow(t, e, info.ID, id)
			require.True(t, ok)
			require.Equal(t, row64(id), row)
		}
	}
	verify(e)
	st := e.Stats()
	require.LessOrEqual(t, st.CacheBytes, int64(MinCacheBytes))
	require.NotZero(t, st.Checkpoints)
	require.NoError(t, e.Close())
	e2 := openTest(t, Options{Dir: dir, CacheBytes: MinCacheBytes})
	verify(e2)
}

func TestFencing(t *testing.T) {
	now := fakeClock{}
	e := openTest(t, Options{Now: now.Now})
	info, g1 := ownedTable(t, e, "t", 64, 1, testGrantPages)
	_, err := e.Acquire(info.ID, 2, 0)
	require.ErrorIs(t, err, ErrTableOwned)
	now.Advance(DefaultLeaseDuration + 1)
	g2 := acquire(t, e, info.ID, 2, 0)
	requireGranted(t, e, info.ID, 2, g2.Epoch)
	require.Greater(t, g2.Epoch, g1.Epoch)
	_, err = e.CommitWait(&base.Batch{Owner: 1, Seq: 1, Fences: []base.Fence{{Table: info.ID, Epoch: g1.Epoch}}, Segments: []base.Segment{oneRow(info.ID, 1, row64(1))}})
	require.ErrorIs(t, err, ErrFenced)
	_, err = e.Acquire(info.ID, 1, g1.Epoch)
	require.ErrorIs(t, err, ErrFenced)
	commitWait(t, e, &base.Batch{Owner: 2, Seq: 1, Fences: []base.Fence{{Table: info.ID, Epoch: g2.Epoch}}, Segments: []base.Segment{oneRow(info.ID, 1, row64(1))}})
}

// TestLockedDirectory: a directory an engine of this process has open is refused with
// ErrAlreadyOpen (which matches ErrLocked), and the message does not blame another process
// (vfs's TestDefaultLockAcrossProcesses covers a real other process).
func TestLockedDirectory(t *testing.T) {
	dir := t.TempDir()
	e := openTest(t, Options{Dir: dir})
	_, err := Open(Options{Dir: dir})
	require.ErrorIs(t, err, ErrAlreadyOpen)
	require.ErrorIs(t, err, ErrLocked)
	require.NotContains(t, err.Error(), "another process")
	require.Contains(t, err.Error(), "already open in this process")
	require.Contains(t, err.Error(), dir)
	require.NoError(t, e.Close())
	e2, err := Open(Options{Dir: dir})
	require.NoError(t, err, "free once the first engine closed")
	require.NoError(t, e2.Close())
}

var _ = vfs.Default
