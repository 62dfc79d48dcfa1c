package store

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/logicpage"
	"github.com/weftdb/weft/storenode"
)

func openEmbedded(t *testing.T) Store {
	t.Helper()
	s, err := OpenEmbedded(storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone, ExpireLeasesAtOpen: true})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s
}

// TestEmbeddedRoundTrip walks the seam as a transaction node does: a table, its ownership, an
// id grant, a commit, sparse reads of what it wrote and the page directory.
func TestEmbeddedRoundTrip(t *testing.T) {
	ctx := context.Background()
	s := openEmbedded(t)
	info := s.Info()
	require.Equal(t, "none", info.SyncMode)
	require.Zero(t, info.Lease, "nobody else reaches an embedded store: no lease to renew")
	require.Positive(t, info.MaxBatchBytes)

	tab, err := s.CreateTable(ctx, "items", 64)
	require.NoError(t, err)
	require.Equal(t, base.TableInfo{ID: tab.ID, Name: "items", RowBytes: 64}, tab)
	g, err := s.Acquire(ctx, tab.ID, 7, 0, 0)
	require.NoError(t, err)
	require.NotZero(t, g.Epoch)
	first, count, err := s.AllocIDs(ctx, tab.ID, 7, g.Epoch, 1)
	require.NoError(t, err)
	require.Equal(t, uint64(logicpage.RowsPerPage), count)

	rows := make([]byte, 2*64)
	rows[0], rows[64] = 1, 2
	page := first / logicpage.RowsPerPage
	slot := first % logicpage.RowsPerPage
	data := uint64(0b11) << slot
	done := make(chan error, 1)
	s.Commit(&base.Batch{Owner: 7, Seq: 1, Fences: []base.Fence{{Table: tab.ID, Epoch: g.Epoch}},
		Segments: []base.Segment{{Table: tab.ID, RowBytes: 64, Page: page, Data: data, Rows: rows}}},
		func(lsn uint64, err error) { done <- err })
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("commit not acknowledged")
	}

	want := data | 1<<(slot+2)
	var got []byte
	err = s.Read(ctx, []base.PageWant{{Table: tab.ID, Page: page, Want: want}}, func(i int, d, c uint64, r []byte) {
		require.Equal(t, 0, i)
		require.Equal(t, data, d)
		require.Equal(t, want&^data, c)
		got = append(got, r...) // r is valid only during the call
	})
	require.NoError(t, err)
	require.Equal(t, rows, got)

	dir, next, err := s.PageDir(ctx, tab.ID, 0, page+10, 16, nil)
	require.NoError(t, err)
	require.Equal(t, []PageInfo{{Page: page, Present: data}}, dir)
	require.Equal(t, page+10, next)

	ts, err := s.ListTables(ctx)
	require.NoError(t, err)
	require.Len(t, ts, 1)
	require.Equal(t, first+count, ts[0].NextID)
}

// TestEmbeddedDropTableOwner: DropTable acts for the owner it is given, so a node that does
// not hold a table cannot drop it under the holder (the owner used to be patched into the
// embedded store by txnode.Open, and was 0 for a store built by hand).
func TestEmbeddedDropTableOwner(t *testing.T) {
	ctx := context.Background()
	s := openEmbedded(t)
	tab, err := s.CreateTable(ctx, "items", 64)
	require.NoError(t, err)
	_, err = s.Acquire(ctx, tab.ID, 7, 0, 0)
	require.NoError(t, err)
	err = s.DropTable(ctx, "items", 8)
	require.ErrorIs(t, err, storenode.ErrTableOwned)
	require.NoError(t, s.DropTable(ctx, "items", 7), "its holder drops it")
	_, err = s.OpenTable(ctx, "items")
	require.ErrorIs(t, err, storenode.ErrTableNotFound)
	require.NotContains(t, err.Error(), "sgio")
}

// TestEmbeddedAfterClose: after Close every method fails with storenode.ErrClosed and
// ErrClosed (txnode.ErrClosed), as the package doc says, rather than answering from a closed engine;
// a second Close is nil. Fails on 36b8b47: ListTables listed the closed engine's tables and
// Ping reported nil.
func TestEmbeddedAfterClose(t *testing.T) {
	ctx := context.Background()
	s, err := OpenEmbedded(storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone, ExpireLeasesAtOpen: true})
	require.NoError(t, err)
	tab, err := s.CreateTable(ctx, "items", 64)
	require.NoError(t, err)
	g, err := s.Acquire(ctx, tab.ID, 7, 0, 0)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	require.NoError(t, s.Close(), "a second Close")
	closed := func(err error, what string) {
		t.Helper()
		require.ErrorIs(t, err, storenode.ErrClosed, what)
		require.ErrorIs(t, err, ErrClosed, what+": txnode.ErrClosed too")
	}

	_, err = s.CreateTable(ctx, "other", 64)
	closed(err, "CreateTable")
	_, err = s.OpenTable(ctx, "items")
	closed(err, "OpenTable")
	ts, err := s.ListTables(ctx)
	closed(err, "ListTables")
	require.Empty(t, ts)
	closed(s.DropTable(ctx, "items", 7), "DropTable")
	_, err = s.Acquire(ctx, tab.ID, 7, g.Epoch, 0)
	closed(err, "Acquire")
	_, _, err = s.AllocIDs(ctx, tab.ID, 7, g.Epoch, 1)
	closed(err, "AllocIDs")
	err = s.Read(ctx, []base.PageWant{{Table: tab.ID, Page: 0, Want: 1}}, func(int, uint64, uint64, []byte) {
		t.Error("fill after Close")
	})
	closed(err, "Read")
	_, _, err = s.PageDir(ctx, tab.ID, 0, 10, 16, nil)
	closed(err, "PageDir")
	closed(s.Ping(ctx), "Ping")
	done := make(chan error, 1)
	s.Commit(&base.Batch{Owner: 7, Seq: 1, Fences: []base.Fence{{Table: tab.ID, Epoch: g.Epoch}},
		Segments: []base.Segment{{Table: tab.ID, RowBytes: 64, Page: 0, Clear: 1}}}, func(_ uint64, err error) { done <- err })
	closed(<-done, "Commit")
}

// TestEmbeddedErrorsReadAsStorenode walks the errors a game can meet through the embedded
// store: each matches its storenode sentinel and reads "storenode: ..." (or the package that
// found it), never the wire's "sgio: ...". (A guard: it held on 36b8b47.)
func TestEmbeddedErrorsReadAsStorenode(t *testing.T) {
	ctx := context.Background()
	s := openEmbedded(t)
	tab, err := s.CreateTable(ctx, "items", 64)
	require.NoError(t, err)
	g, err := s.Acquire(ctx, tab.ID, 7, 0, 0)
	require.NoError(t, err)
	first, _, err := s.AllocIDs(ctx, tab.ID, 7, g.Epoch, 1)
	require.NoError(t, err)
	commit := func(b *base.Batch) error {
		done := make(chan error, 1)
		s.Commit(b, func(_ uint64, err error) { done <- err })
		return <-done
	}
	fence := []base.Fence{{Table: tab.ID, Epoch: g.Epoch}}
	row := make([]byte, 64)
	seg := func(id uint64) []base.Segment {
		return []base.Segment{{Table: tab.ID, RowBytes: 64, Page: id / logicpage.RowsPerPage, Data: 1 << (id % logicpage.RowsPerPage), Rows: row}}
	}
	require.NoError(t, commit(&base.Batch{Owner: 7, Seq: 1, Fences: fence, Segments: seg(first)}))

	_, errExists := s.CreateTable(ctx, "items", 64)
	_, errName := s.CreateTable(ctx, "bad name", 64)
	_, errRow := s.CreateTable(ctx, "odd", 63)
	_, errNotFound := s.OpenTable(ctx, "nope")
	errDrop := s.DropTable(ctx, "nope", 7)
	_, errOwned := s.Acquire(ctx, tab.ID, 8, 0, 0)
	_, errRenew := s.Acquire(ctx, tab.ID, 7, g.Epoch+1, 0)
	_, _, errGrant := s.AllocIDs(ctx, tab.ID, 8, g.Epoch, 1)
	errFenced := commit(&base.Batch{Owner: 7, Seq: 2, Fences: []base.Fence{{Table: tab.ID, Epoch: g.Epoch + 1}}, Segments: seg(first)})
	errGranted := commit(&base.Batch{Owner: 7, Seq: 2, Fences: fence, Segments: seg(first + logicpage.RowsPerPage)})
	errEmpty := commit(&base.Batch{Owner: 7, Seq: 2, Fences: fence})
	errReused := commit(&base.Batch{Owner: 7, Seq: 1, Fences: fence, Segments: seg(first + 1)})
	errRead := s.Read(ctx, []base.PageWant{{Table: tab.ID + 100, Page: 0, Want: 1}}, func(int, uint64, uint64, []byte) {})
	_, _, errDir := s.PageDir(ctx, tab.ID+100, 0, 1, 1, nil)
	for _, c := range []struct {
		err, want error
	}{
		{errExists, storenode.ErrTableExists}, {errName, storenode.ErrBadName}, {errRow, storenode.ErrRowSize},
		{errNotFound, storenode.ErrTableNotFound}, {errDrop, storenode.ErrTableNotFound},
		{errOwned, storenode.ErrTableOwned}, {errRenew, storenode.ErrFenced}, {errGrant, storenode.ErrFenced},
		{errFenced, storenode.ErrFenced}, {errGranted, storenode.ErrMalformed}, {errEmpty, storenode.ErrMalformed},
		{errReused, storenode.ErrSeqReused}, {errRead, storenode.ErrTableNotFound}, {errDir, storenode.ErrTableNotFound},
	} {
		require.ErrorIs(t, c.err, c.want)
		require.NotContains(t, c.err.Error(), "sgio", c.err.Error())
	}
}
