package txnode

import (
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/internal/assert"
)

// viewTable opens an embedded DB with the table "v" of 128-byte rows holding three rows, the
// third deleted, and returns the DB, the table, the ids and the second row's bytes (Get's).
func viewTable(t *testing.T, ctx context.Context) (*DB, *Table, []uint64, []byte) {
	t.Helper()
	db := openEmbedded(t, "", Options{})
	tb := newTable(t, ctx, db, "v", 128)
	ids := insertRows(t, db, tb, 3)
	require.NoError(t, tb.Delete(ctx, ids[2]))
	want := make([]byte, 128)
	require.NoError(t, tb.Get(ctx, ids[1], want))
	return db, tb, ids, want
}

// insertZeroRows inserts at least rows rows of zeros into tb, 512 to a transaction (a whole
// number of transactions), and returns their ids.
func insertZeroRows(t *testing.T, ctx context.Context, db *DB, tb *Table, rows int) []uint64 {
	t.Helper()
	ids := make([]uint64, 0, rows)
	for len(ids) < rows {
		require.NoError(t, db.Update(ctx, func(tx *Tx) error {
			for range 512 {
				id, err := tx.Insert(tb, make([]byte, tb.RowBytes()))
				if err != nil {
					return err
				}
				ids = append(ids, id)
			}
			return nil
		}))
	}
	return ids
}

// reopenEmbedded closes db and opens an embedded DB on its directory again (an empty cache),
// and in it the table name.
func reopenEmbedded(t *testing.T, ctx context.Context, db *DB, name string) (*DB, *Table) {
	t.Helper()
	dir := db.opts.Dir
	require.NoError(t, db.Close(ctx))
	db = openEmbedded(t, dir, Options{})
	return db, openTable(t, ctx, db, name)
}

// TestView: Table.View and Tx.View show the row Get copies, ErrNotFound without calling fn
// for a row that does not exist (deleted, or never granted), fn's own error as it returned
// it, and, in a transaction, its own pending writes.
func TestView(t *testing.T) {
	ctx := context.Background()
	db, tb, ids, want := viewTable(t, ctx)

	var got []byte
	keep := func(row []byte) error { got = append(got[:0], row...); return nil }
	require.NoError(t, tb.View(ctx, ids[1], keep))
	require.Equal(t, want, got)
	require.Len(t, got, 128)

	called := false
	never := func([]byte) error { called = true; return nil }
	require.ErrorIs(t, tb.View(ctx, ids[2], never), ErrNotFound)
	require.ErrorIs(t, tb.View(ctx, ids[2]+1<<20, never), ErrNotFound)
	require.False(t, called)

	require.PanicsWithValue(t, "weft: invariant violated: txnode: Table.View with a nil function", func() { _ = tb.View(ctx, ids[0], nil) })
	mine := errors.New("fn's own")
	require.Same(t, mine, tb.View(ctx, ids[0], func([]byte) error { return mine }))

	require.NoError(t, db.Update(ctx, func(tx *Tx) error {
		if err := tx.View(tb, ids[1], keep); err != nil {
			return err
		}
		require.Equal(t, want, got)
		require.NoError(t, tx.Put(tb, ids[1], u64Row(128, 77)))
		require.NoError(t, tx.View(tb, ids[1], keep))
		require.Equal(t, u64Row(128, 77), got, "the transaction's own write")
		require.NoError(t, tx.Delete(tb, ids[0]))
		require.ErrorIs(t, tx.View(tb, ids[0], never), ErrNotFound)
		require.ErrorIs(t, tx.View(tb, ids[2], never), ErrNotFound)
		return nil
	}))
	require.False(t, called)

	// A cold row (a DB reopened on the directory starts with an empty cache): the slow
	// path fetches it, then calls fn.
	require.NoError(t, tb.Get(ctx, ids[1], want))
	db, tb = reopenEmbedded(t, ctx, db, "v")
	require.NoError(t, tb.View(ctx, ids[1], keep))
	require.Equal(t, want, got)
	require.Equal(t, uint64(1), db.Stats().PageMisses)
	require.ErrorIs(t, tb.View(ctx, ids[2], never), ErrNotFound)
	require.False(t, called)
	tx := openTx(t, ctx, db, false)
	require.NoError(t, tx.Commit())
	require.ErrorIs(t, tx.View(tb, ids[1], keep), ErrTxDone)
}

// TestTxViewConflict: a View inside a transaction is in its read set like a Get: a commit
// that changes the row before the reader commits fails the reader with ErrConflict, and
// DB.Update's retry then sees the new row.
func TestTxViewConflict(t *testing.T) {
	ctx := context.Background()
	db := openEmbedded(t, "", Options{})
	tb, ids := newTableRows(t, ctx, db, "v", 2)

	tx := openTx(t, ctx, db, false)
	var seen uint64
	require.NoError(t, tx.View(tb, ids[0], func(row []byte) error {
		seen = binary.LittleEndian.Uint64(row)
		return nil
	}))
	require.Equal(t, uint64(0), seen)
	require.NoError(t, tb.Put(ctx, ids[0], u64Row(64, 5)))
	require.ErrorIs(t, tx.Commit(), ErrConflict)

	// Write skew through Views: each transaction reads the other's row and writes its own;
	// serializability lets at most one of the two commit as it was.
	attempts := 0
	started, wrote := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- db.Update(ctx, func(tx *Tx) error {
			attempts++
			var v uint64
			if err := tx.View(tb, ids[1], func(row []byte) error { v = binary.LittleEndian.Uint64(row); return nil }); err != nil {
				return err
			}
			if attempts == 1 {
				close(started)
				<-wrote // the other commits after this read
			}
			return tx.Put(tb, ids[0], u64Row(64, v+100))
		})
	}()
	<-started
	require.NoError(t, tb.Put(ctx, ids[1], u64Row(64, 9)))
	close(wrote)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("Update did not finish")
	}
	require.Equal(t, 2, attempts, "the first attempt read a row changed before it committed")
	row := make([]byte, 64)
	require.NoError(t, tb.Get(ctx, ids[0], row))
	require.Equal(t, uint64(109), binary.LittleEndian.Uint64(row), "the retry saw the new row")
}

// TestViewConcurrentWriter: while writers rewrite rows whole (every word derived from one
// value), Views in and out of transactions only ever count a run that saw one whole row: fn
// may see a row being overwritten, but such a run is thrown away and fn runs again. Each
// read-only transaction's Views of two rows the writers change together agree once it
// commits.
func TestViewConcurrentWriter(t *testing.T) {
	ctx := context.Background()
	db := openEmbedded(t, "", Options{})
	const r = 256
	tb := newTable(t, ctx, db, "v", r)
	ids := insertRows(t, db, tb, 2)
	require.NoError(t, tb.Put(ctx, ids[0], u64Row(r, 0)))
	require.NoError(t, tb.Put(ctx, ids[1], u64Row(r, 0)))
	n := 20000
	if testing.Short() {
		n = 2000
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() {
		for v := uint64(1); !stop.Load(); v++ {
			err := db.Update(ctx, func(tx *Tx) error {
				if err := tx.Put(tb, ids[0], u64Row(r, v)); err != nil {
					return err
				}
				return tx.Put(tb, ids[1], u64Row(r, v))
			})
			if err != nil {
				t.Error(err)
				return
			}
		}
	})
	defer func() { stop.Store(true); wg.Wait() }()
	// whole reports which value row holds, or false for a mix of two.
	whole := func(row []byte) (uint64, bool) {
		v := binary.LittleEndian.Uint64(row)
		want := u64Row(r, v)
		return v, string(row) == string(want)
	}
	runs := 0
	for i := range n {
		var v uint64
		ok := false
		require.NoError(t, tb.View(ctx, ids[i%2], func(row []byte) error {
			runs++
			v, ok = whole(row)
			return nil
		}))
		require.True(t, ok, "View counted a mixed row (value %d)", v)
		if i%16 == 0 {
			var a, b uint64
			var aok, bok bool
			err := db.View(ctx, func(tx *Tx) error {
				if err := tx.View(tb, ids[0], func(row []byte) error { a, aok = whole(row); return nil }); err != nil {
					return err
				}
				return tx.View(tb, ids[1], func(row []byte) error { b, bok = whole(row); return nil })
			})
			require.NoError(t, err)
			require.True(t, aok && bok)
			require.Equal(t, a, b, "a committed read-only transaction saw two states")
		}
	}
	t.Logf("%d Views, %d runs of fn", n, runs)
}

// TestViewRetainedIsMisuse shows why View's slice must not outlive fn: kept, it is either
// the cache frame's memory, which the next commit to the row overwrites in place (so the
// "kept" row changes under its holder), or, in invariants builds (-race, weft_invariants),
// a private copy poisoned as soon as fn returns. Neither is the row it was.
func TestViewRetainedIsMisuse(t *testing.T) {
	ctx := context.Background()
	db := openEmbedded(t, "", Options{})
	tb, ids := newTableRows(t, ctx, db, "v", 1)
	require.NoError(t, tb.Put(ctx, ids[0], u64Row(64, 1)))
	var kept []byte
	require.NoError(t, tb.View(ctx, ids[0], func(row []byte) error {
		kept = row // the misuse
		return nil
	}))
	if assert.Invariants {
		for _, c := range kept {
			require.Equal(t, byte(viewPoison), c)
		}
		return
	}
	require.Equal(t, u64Row(64, 1), kept)
	require.NoError(t, tb.Put(ctx, ids[0], u64Row(64, 2)))
	require.Equal(t, u64Row(64, 2), kept, "the kept slice is the frame, overwritten by the commit")
}

// TestViewPanicReleases: a panic in fn on View's slow path (a miss, served in a transaction
// of its own) leaves no frame pinned.
func TestViewPanicReleases(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	db := openEmbedded(t, dir, Options{})
	tb, ids := newTableRows(t, ctx, db, "v", 2)
	require.NoError(t, db.Close(ctx))
	db = openEmbedded(t, dir, Options{}) // an empty cache: View takes the slow path
	tb = openTable(t, ctx, db, "v")
	require.NotPanics(t, func() {
		defer func() { require.Equal(t, "boom", recover()) }()
		_ = tb.View(ctx, ids[0], func([]byte) error { panic("boom") })
	})
	_, m := db.cache.lookup(pageKey(tb.t.id, ids[0]/64))
	require.NotNil(t, m, "the slow path cached the page")
	require.Zero(t, m.pins.Load(), "the panicking View left its frame pinned")
	row := make([]byte, 64)
	require.NoError(t, tb.Get(ctx, ids[1], row))
}

// TestViewUnderEviction: lock-free Views in a cache far smaller than the table, so frames are
// evicted and given to other pages while fn runs on them: the run that counts always saw the
// row asked for (every row's words derive from its own id), never another page's.
func TestViewUnderEviction(t *testing.T) {
	ctx := context.Background()
	db := openEmbedded(t, "", Options{CacheBytes: 1 << 20})
	const r = 64
	tb := newTable(t, ctx, db, "v", r)
	rows := 64 * 600 // 600 pages, ~2.7 MiB of frames: about a third fit
	if testing.Short() {
		rows = 64 * 300
	}
	ids := insertZeroRows(t, ctx, db, tb, rows)
	for lo := 0; lo < len(ids); lo += 512 {
		require.NoError(t, db.Update(ctx, func(tx *Tx) error {
			for _, id := range ids[lo:min(len(ids), lo+512)] {
				if err := tx.Put(tb, id, u64Row(r, id)); err != nil {
					return err
				}
			}
			return nil
		}))
	}
	require.NoError(t, db.pipe.flush(ctx))
	n := 4000
	if testing.Short() {
		n = 1000
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			x := uint64(g + 1)
			for range n {
				x = x*6364136223846793005 + 1442695040888963407
				id := ids[(x>>33)%uint64(len(ids))]
				var v uint64
				ok := false
				err := tb.View(ctx, id, func(row []byte) error {
					v = binary.LittleEndian.Uint64(row)
					ok = string(row) == string(u64Row(r, v))
					return nil
				})
				if err != nil || !ok || v != id {
					t.Errorf("View of row %d: value %d, whole %v, err %v", id, v, ok, err)
					return
				}
			}
		})
	}
	wg.Wait()
	require.NotZero(t, db.Stats().Evictions)
}
