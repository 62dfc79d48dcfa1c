package storenode

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/logicpage"
)

// The engine's page limit is logicpage.TablePagesMax: the last page can be read, the next one is refused with ErrMalformed naming the limit, on commit and on read; a page
// directory stops at the limit.
func TestPageLimitIsTablePagesMax(t *testing.T) {
	require.EqualValues(t, logicpage.TablePagesMax, tablePagesMax)
	require.EqualValues(t, logicpage.TableRowsMax, MaxRowID)
	e, _, info, g := openFault(t, Options{}, testOwner)
	last := uint64(tablePagesMax - 1)

	// The last page is a valid page: it reads as absent. (No commit there: the page map is
	// dense, and a checkpoint would allocate 24 bytes for every page below it.)
	data, clr, _, err := e.ReadRows(info.ID, last, 1<<63, nil)
	require.NoError(t, err, "the last page can be read")
	require.Equal(t, uint64(0), data)
	require.Equal(t, uint64(1<<63), clr)
	dir, next, err := e.PageDir(info.ID, last, logicpage.PageMax, 0, nil)
	require.NoError(t, err)
	require.Empty(t, dir)
	require.Equal(t, uint64(tablePagesMax), next, "a page directory ends at the limit")

	beyond := base.Segment{Table: info.ID, Page: tablePagesMax, Data: 1, Rows: row64(8)}
	_, err = e.CommitWait(batchOf(testOwner, 1, info.ID, g.Epoch, beyond))
	require.ErrorIs(t, err, ErrMalformed)
	require.Contains(t, err.Error(), strconv.FormatUint(last, 10), "the error names the last page")
	for _, page := range []uint64{tablePagesMax, logicpage.PageMax} {
		_, _, _, err = e.ReadRows(info.ID, page, 1, nil)
		require.ErrorIs(t, err, ErrMalformed, "page %d", page)
		require.Contains(t, err.Error(), strconv.FormatUint(last, 10))
	}
	// Seq 1 again: a refused seq is the owner's to fill before any later one (refusedFresh).
	_, err = e.CommitWait(batchOf(testOwner, 1, info.ID, g.Epoch, oneRow(info.ID, 1, row64(9))))
	require.NoError(t, err, "a refused batch leaves the engine usable")
}

// A commit may write only granted ids: one row far past the grants would make the next
// checkpoint allocate the dense page map up to its page (24 bytes a page, 24 GiB at the page
// limit) at every start. Fails on 26994d0: the far row was applied.
func TestCommitBeyondGrantsRefused(t *testing.T) {
	e, _, info, g := openFault(t, Options{}, testOwner)
	next := tableInfo(t, e, info.ID).NextID
	var seq uint64
	commit := func(s base.Segment) error {
		seq++
		_, err := e.CommitWait(batchOf(testOwner, seq, info.ID, g.Epoch, s))
		if err != nil {
			seq-- // a refused batch is not applied: its seq is free again
		}
		return err
	}
	for _, s := range []base.Segment{
		{Table: info.ID, Page: tablePagesMax - 1, Data: 1, Rows: row64(1)},
		oneRow(info.ID, next, row64(2)),
		{Table: info.ID, Page: next / logicpage.RowsPerPage, Clear: 1},
		{Table: info.ID, Page: next/logicpage.RowsPerPage - 1, Data: 1, Clear: 1 << 63, Rows: row64(3)},
	} {
		err := commit(s)
		if s.Clear == 1<<63 {
			require.NoError(t, err, "a delete of the last granted id is a granted write")
			continue
		}
		require.ErrorIs(t, err, ErrMalformed, "page %d data %#x clear %#x", s.Page, s.Data, s.Clear)
		require.Contains(t, err.Error(), "never granted")
	}
	require.NoError(t, commit(oneRow(info.ID, next-1, row64(4))), "the last granted id")
	require.NoError(t, e.Checkpoint())
	require.Equal(t, uint64(2), tableInfo(t, e, info.ID).Rows)
}

// An empty segment (no data, no clear: it writes nothing) names a page too, and applying it
// dirties that page's frame, so a checkpoint grows the dense page map to it just as a row
// there would: it too may name only a granted page. Fails on 36b8b47: the empty segment past
// the grants was applied and the checkpoint grew the page map to its page.
func TestCommitEmptySegmentBeyondGrantsRefused(t *testing.T) {
	e, _, info, g := openFault(t, Options{}, testOwner)
	next := tableInfo(t, e, info.ID).NextID
	far := next/logicpage.RowsPerPage + 1000
	_, err := e.CommitWait(batchOf(testOwner, 1, info.ID, g.Epoch,
		base.Segment{Table: info.ID, Page: far}))
	require.ErrorIs(t, err, ErrMalformed)
	require.Contains(t, err.Error(), "never granted")
	_, err = e.CommitWait(batchOf(testOwner, 1, info.ID, g.Epoch,
		base.Segment{Table: info.ID, Page: next / logicpage.RowsPerPage}))
	require.ErrorIs(t, err, ErrMalformed, "the first page past the grants")
	_, err = e.CommitWait(batchOf(testOwner, 1, info.ID, g.Epoch,
		base.Segment{Table: info.ID, Page: next/logicpage.RowsPerPage - 1}))
	require.NoError(t, err, "an empty segment of a granted page is harmless")
	require.NoError(t, e.Checkpoint())
	e.mu.Lock()
	pages := e.tables[info.ID].pages.count()
	e.mu.Unlock()
	require.LessOrEqual(t, uint64(pages), next/logicpage.RowsPerPage, "the page map covers granted pages only")
}

// One row in a far page costs a bounded amount of page-map memory and meta bytes: the map is
// sparse. A client may AllocIDs up to the id limit (about 16K grants) and commit a row in the
// last page; the checkpoint, the meta file and the next Open must not grow with the page
// number. Fails on 3d9139f: the dense map of a row at page 2^22 alone made a 100 MB meta file.
func TestFarPageCostsBoundedMapAndMeta(t *testing.T) {
	e, fs, info, g := openFault(t, Options{}, testOwner)
	var seq uint64
	metaBytes := func() int {
		b, err := fs.ReadFile("db/meta")
		require.NoError(t, err)
		return len(b)
	}
	const bound = 16 << 10
	for _, page := range []uint64{1 << 22, tablePagesMax - 1} {
		for next := tableInfo(t, e, info.ID).NextID; next <= page*logicpage.RowsPerPage+63; {
			_, n, err := e.AllocIDs(info.ID, testOwner, g.Epoch, int(min(idPagesPerGrantMax, page+1-next/logicpage.RowsPerPage)))
			require.NoError(t, err)
			next += n
		}
		seq++
		commitWait(t, e, batchOf(testOwner, seq, info.ID, g.Epoch,
			base.Segment{Table: info.ID, Page: page, Data: 1 << 63, Rows: row64(seq)}))
		require.NoError(t, e.Checkpoint())
		require.Less(t, metaBytes(), bound, "meta file after a row in page %d", page)
		e.mu.Lock()
		mem := e.tables[info.ID].pages.memBytes()
		e.mu.Unlock()
		require.Less(t, mem, bound, "page-map memory after a row in page %d", page)
	}
	require.NoError(t, e.Close())
	e2 := openEngine(t, Options{Dir: "db", FS: fs, Logger: quietLogger, CheckpointInterval: -1})
	defer e2.Close()
	for i, page := range []uint64{1 << 22, tablePagesMax - 1} {
		data, _, rows, err := e2.ReadRows(info.ID, page, 1<<63, nil)
		require.NoError(t, err)
		require.Equal(t, uint64(1<<63), data)
		require.Equal(t, row64(uint64(i+1)), rows)
	}
}
