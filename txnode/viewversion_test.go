package txnode

import (
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestViewVersion: Table.ViewVersion shows the row View shows with its version: the same
// version while the row is unchanged, a new one after every write (a Put of the same bytes
// too), ErrNotFound without calling fn for a row that does not exist, fn's own error, and on
// a cold row (the slow path) the row and a version too.
func TestViewVersion(t *testing.T) {
	ctx := context.Background()
	db, tb, ids, want := viewTable(t, ctx)

	var got []byte
	var ver uint64
	keep := func(row []byte, v uint64) error { got, ver = append(got[:0], row...), v; return nil }
	require.NoError(t, tb.ViewVersion(ctx, ids[1], keep))
	require.Equal(t, want, got)
	v0 := ver
	require.NoError(t, tb.ViewVersion(ctx, ids[1], keep))
	require.Equal(t, v0, ver, "unchanged row, same version")

	require.NoError(t, tb.Put(ctx, ids[1], u64Row(128, 5)))
	require.NoError(t, tb.ViewVersion(ctx, ids[1], keep))
	require.Equal(t, u64Row(128, 5), got)
	require.Greater(t, ver, v0, "a write gives a new version")
	v1 := ver
	require.NoError(t, tb.Put(ctx, ids[1], u64Row(128, 5)))
	require.NoError(t, tb.ViewVersion(ctx, ids[1], keep))
	require.Greater(t, ver, v1, "the same bytes written again: a new version all the same")

	called := false
	never := func([]byte, uint64) error { called = true; return nil }
	require.ErrorIs(t, tb.ViewVersion(ctx, ids[2], never), ErrNotFound)
	require.ErrorIs(t, tb.ViewVersion(ctx, ids[2]+1<<20, never), ErrNotFound)
	require.False(t, called)
	require.PanicsWithValue(t, "weft: invariant violated: txnode: Table.ViewVersion with a nil function", func() { _ = tb.ViewVersion(ctx, ids[0], nil) })
	mine := errors.New("fn's own")
	require.Same(t, mine, tb.ViewVersion(ctx, ids[0], func([]byte, uint64) error { return mine }))

	// A cold row: the slow path fetches it, then calls fn with the version it was filled at.
	require.NoError(t, tb.Get(ctx, ids[1], want))
	db, tb = reopenEmbedded(t, ctx, db, "v")
	require.NoError(t, tb.ViewVersion(ctx, ids[1], keep))
	require.Equal(t, want, got)
	require.Equal(t, uint64(1), db.Stats().PageMisses)
	cold := ver
	require.NoError(t, tb.ViewVersion(ctx, ids[1], keep))
	require.Equal(t, cold, ver, "the fetched row's version stays while it is unchanged")
	require.ErrorIs(t, tb.ViewVersion(ctx, ids[2], never), ErrNotFound)
	require.False(t, called)
}

// TestViewVersionIdentifiesBytes: what hashindex's memo rests on. Writers rewrite rows
// (each write a new value) in a cache about a third of the table's size, so rows are
// evicted and fetched again, while readers ViewVersion them: every (row, version) seen twice
// came with the same bytes, in place or refetched, for the DB's life.
func TestViewVersionIdentifiesBytes(t *testing.T) {
	ctx := context.Background()
	db := openEmbedded(t, "", Options{CacheBytes: 1 << 20})
	const r = 64
	tb := newTable(t, ctx, db, "v", r)
	rows, n := 64*600, 4000
	if testing.Short() {
		rows, n = 64*300, 1000
	}
	ids := insertZeroRows(t, ctx, db, tb, rows)
	type seen struct{ id, ver uint64 }
	var mu sync.Mutex
	bytesOf := map[seen]uint64{} // the row's value (u64Row) at that version
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			x := uint64(g + 1)
			for i := range n {
				x = x*6364136223846793005 + 1442695040888963407
				id := ids[(x>>33)%uint64(len(ids)/8)*8] // a few rows of each page, read often
				if g == 0 && i%4 == 0 {
					if err := tb.Put(ctx, id, u64Row(r, x|1)); err != nil {
						t.Errorf("Put of row %d: %v", id, err)
						return
					}
					continue
				}
				var v, ver uint64
				ok := false
				err := tb.ViewVersion(ctx, id, func(row []byte, rv uint64) error {
					v, ver = binary.LittleEndian.Uint64(row), rv
					ok = string(row) == string(u64Row(r, v)) || v == 0 && string(row) == string(make([]byte, r))
					return nil
				})
				if err != nil || !ok {
					t.Errorf("ViewVersion of row %d: whole %v, err %v", id, ok, err)
					return
				}
				mu.Lock()
				if w, dup := bytesOf[seen{id, ver}]; dup && w != v {
					t.Errorf("row %d at version %d: value %d, and %d before", id, ver, v, w)
				}
				bytesOf[seen{id, ver}] = v
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.NotZero(t, db.Stats().Evictions)
}
