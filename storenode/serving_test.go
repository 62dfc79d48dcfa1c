package storenode

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
)

// servingEngine opens an engine with one table whose rows 1..3 testOwner committed and
// synced, so they are cached and durable.
func servingEngine(t *testing.T) (*Engine, uint32) {
	t.Helper()
	e := openTest(t, Options{Sync: SyncAlways})
	info, g := ownedTable(t, e, "t", 64, testOwner, 1)
	fences := []base.Fence{{Table: info.ID, Epoch: g.Epoch}}
	for id := uint64(1); id <= 3; id++ {
		commitWait(t, e, &base.Batch{Owner: testOwner, Seq: id, Fences: fences, Segments: []base.Segment{oneRow(info.ID, id, row64(id))}})
	}
	return e, info.ID
}

// ReadCached answers from the cache what ReadRowsAs answers, and never waits: with the
// engine's lock taken it reports false at once (an event loop calls it).
func TestReadCached(t *testing.T) {
	e, table := servingEngine(t)
	wants := []base.PageWant{{Table: table, Page: 0, Want: 0b1111}}
	segs := make([]base.Segment, 1)
	for _, reader := range []uint64{testOwner, 0, 99} {
		rows, ok := e.ReadCached(reader, wants, segs, nil)
		require.True(t, ok, "reader %d", reader)
		require.Equal(t, uint64(0b1110), segs[0].Data)
		require.Equal(t, uint64(0b0001), segs[0].Clear)
		require.Equal(t, 64, int(segs[0].RowBytes))
		data, clear, want, err := e.ReadRowsAs(reader, table, 0, 0b1111, nil)
		require.NoError(t, err)
		require.Equal(t, []uint64{data, clear}, []uint64{segs[0].Data, segs[0].Clear})
		require.Equal(t, want, rows)
		require.Equal(t, want, segs[0].Rows)
	}
	size, err := e.PresentRowsSize(wants)
	require.NoError(t, err)
	require.Equal(t, 3*64, size)

	e.mu.Lock()
	_, ok := e.ReadCached(testOwner, wants, segs, nil)
	e.mu.Unlock()
	require.False(t, ok, "the engine's lock is taken: the slow path, not a wait")

	_, ok = e.ReadCached(testOwner, []base.PageWant{{Table: table + 1, Page: 0, Want: 1}}, segs, nil)
	require.False(t, ok, "no such table: the slow path reports the error")
	_, err = e.PresentRowsSize([]base.PageWant{{Table: table + 1, Page: 0, Want: 1}})
	require.ErrorIs(t, err, ErrTableNotFound)
	_, err = e.PresentRowsSize([]base.PageWant{{Table: table, Page: tablePagesMax, Want: 1}})
	require.ErrorIs(t, err, ErrMalformed)

	rb, err := e.RowBytes(table)
	require.NoError(t, err)
	require.Equal(t, 64, rb)
	_, err = e.RowBytes(table + 1)
	require.ErrorIs(t, err, ErrTableNotFound)
	require.Equal(t, 1, e.TableCount())
	require.NoError(t, e.Failure())
}

// A ReadCached that gives up midway answers nothing: the rows it gathered for the wants
// before the one that needs the disk are not in what it returns (its doc: "ok is false, and
// nothing is answered"), so a caller that goes on appending to out after a false does not
// send or keep them. Fails before the fix: out held page 0's rows.
func TestReadCachedGivesUpCleanly(t *testing.T) {
	dir := t.TempDir()
	e := openTest(t, Options{Dir: dir, Sync: SyncAlways})
	info, g := ownedTable(t, e, "t", 64, testOwner, 2)
	fences := []base.Fence{{Table: info.ID, Epoch: g.Epoch}}
	for seq, id := range []uint64{1, 65} { // pages 0 and 1
		commitWait(t, e, &base.Batch{Owner: testOwner, Seq: uint64(seq + 1), Fences: fences, Segments: []base.Segment{oneRow(info.ID, id, row64(id))}})
	}
	require.NoError(t, e.Close())
	e = openTest(t, Options{Dir: dir, Sync: SyncAlways})         // nothing cached
	_, _, _, err := e.ReadRowsAs(0, info.ID, 0, ^uint64(0), nil) // page 0 cached, page 1 not
	require.NoError(t, err)

	wants := []base.PageWant{{Table: info.ID, Page: 0, Want: ^uint64(0)}, {Table: info.ID, Page: 1, Want: ^uint64(0)}}
	segs := make([]base.Segment, len(wants))
	prefix := []byte("kept")
	buf := append(make([]byte, 0, 1024), prefix...)
	out, ok := e.ReadCached(0, wants, segs, buf)
	require.False(t, ok, "page 1 needs the disk")
	require.Equal(t, prefix, out, "nothing answered: out is rows as given")
}
