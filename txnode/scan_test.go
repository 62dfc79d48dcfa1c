package txnode

import (
	"context"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// Scans: a transaction's scan sees its own writes; a commit that inserts, deletes or changes
// a row of a scanned range makes the scanning transaction fail validation (no phantoms); a
// plain scan asks the store which pages hold rows and reads only those.

func scanIDs(t *testing.T, seq func(func(Row, error) bool)) []uint64 {
	t.Helper()
	var ids []uint64
	for r, err := range seq {
		require.NoError(t, err)
		ids = append(ids, r.ID)
	}
	return ids
}

func insertRows(t *testing.T, db *DB, tb *Table, n int) []uint64 {
	t.Helper()
	var ids []uint64
	for len(ids) < n {
		k := min(n-len(ids), 512)
		var got []uint64
		require.NoError(t, db.Update(context.Background(), func(tx *Tx) error {
			got = got[:0]
			for range k {
				id, err := tx.Insert(tb, u64Row(tb.RowBytes(), uint64(len(ids)+len(got))))
				if err != nil {
					return err
				}
				got = append(got, id)
			}
			return nil
		}))
		ids = append(ids, got...)
	}
	return ids
}

// newTableRows creates the table name of 64-byte rows in db and inserts n rows in it
// (insertRows), failing the test on error; it returns the table and the rows' ids.
func newTableRows(t *testing.T, ctx context.Context, db *DB, name string, n int) (*Table, []uint64) {
	t.Helper()
	tb := newTable(t, ctx, db, name, 64)
	return tb, insertRows(t, db, tb, n)
}

func TestTxScanOwnWrites(t *testing.T) {
	ctx := context.Background()
	eachConfig(t, openConfigs(t), Options{}, func(t *testing.T, db *DB) {
		tb, ids := newTableRows(t, ctx, db, "s", 100)
		var inserted uint64
		err := db.Update(ctx, func(tx *Tx) error {
			require.NoError(t, tx.Delete(tb, ids[10]))
			require.NoError(t, tx.Put(tb, ids[11], u64Row(64, 1111)))
			var err error
			inserted, err = tx.Insert(tb, u64Row(64, 2222))
			require.NoError(t, err)
			want := map[uint64]uint64{}
			for i, id := range ids {
				want[id] = uint64(i)
			}
			delete(want, ids[10])
			want[ids[11]] = 1111
			want[inserted] = 2222
			got := map[uint64]uint64{}
			last := uint64(0)
			for r, err := range tx.Scan(tb, 0, math.MaxUint64) {
				require.NoError(t, err)
				require.True(t, len(got) == 0 || r.ID > last, "ids ascend")
				last = r.ID
				got[r.ID] = checkRow(t, r.Data)
			}
			require.Equal(t, want, got)
			// A sub-range, and an empty one.
			require.Equal(t, []uint64{ids[9], ids[11], ids[12]}, scanIDs(t, tx.Scan(tb, ids[9], ids[13])))
			require.Empty(t, scanIDs(t, tx.Scan(tb, ids[10], ids[11])))
			return nil
		})
		require.NoError(t, err)
		// Committed: the plain scan sees the same.
		got := scanIDs(t, tb.Scan(ctx, 0, math.MaxUint64))
		require.Len(t, got, 100)
		require.NotContains(t, got, ids[10])
		require.Contains(t, got, inserted)
	})
}

// TestScanPhantoms: a manual transaction scans a range, another commit changes the range,
// and the scanner's Commit must fail with ErrConflict. The scanner also writes (else its
// serialization point could simply be before the other commit: a read-only transaction is
// validated too, so it fails as well).
func TestScanPhantoms(t *testing.T) {
	ctx := context.Background()
	type change struct {
		name string
		// lo, hi of the scan, given the rows' ids
		rng func(ids []uint64) (uint64, uint64)
		// do changes the range from outside the transaction, the k-th time
		do func(t *testing.T, tb *Table, ids []uint64, k int)
		// conflict: whether the scanner must fail
		conflict bool
	}
	all := func(ids []uint64) (uint64, uint64) { return 0, math.MaxUint64 }
	firstPage := func(ids []uint64) (uint64, uint64) { return ids[0], ids[0] + 64 }
	changes := []change{
		{"insert into the last page", all, func(t *testing.T, tb *Table, ids []uint64, k int) {
			insertRow(t, ctx, tb, u64Row(64, 7))
		}, true},
		{"insert past the high-water mark", all, func(t *testing.T, tb *Table, ids []uint64, k int) {
			for range 200 { // takes a new grant: ids no scan has seen a page of
				insertRow(t, ctx, tb, u64Row(64, 7))
			}
		}, true},
		{"delete", firstPage, func(t *testing.T, tb *Table, ids []uint64, k int) {
			require.NoError(t, tb.Delete(ctx, ids[5+k]))
		}, true},
		{"update", firstPage, func(t *testing.T, tb *Table, ids []uint64, k int) {
			require.NoError(t, tb.Put(ctx, ids[5+k], u64Row(64, 5555)))
		}, true},
		{"update outside the range", firstPage, func(t *testing.T, tb *Table, ids []uint64, k int) {
			require.NoError(t, tb.Put(ctx, ids[100], u64Row(64, 5555)))
		}, false},
	}
	for _, cfg := range openConfigs(t) {
		for _, reopen := range []bool{false, true} {
			for _, c := range changes {
				name := cfg.name + "/" + c.name
				if reopen {
					// After a reopen no id of the range was granted in this run: the scan
					// learns from the store, and inserts land past its high-water mark.
					name += "/reopened"
				}
				t.Run(name, func(t *testing.T) {
					open := cfg.opener(t)
					db := open(Options{})
					tb := newTable(t, ctx, db, "p", 64)
					other := newTable(t, ctx, db, "other", 64)
					ids := insertRows(t, db, tb, 150) // two full pages and a partial one
					oid := insertRow(t, ctx, other, u64Row(64, 0))
					if reopen {
						require.NoError(t, db.Close(ctx))
						db = open(Options{})
						tb = openTable(t, ctx, db, "p")
						other = openTable(t, ctx, db, "other")
					}
					lo, hi := c.rng(ids)
					for k, readOnly := range []bool{false, true} {
						tx := openTx(t, ctx, db, !readOnly)
						n := len(scanIDs(t, tx.Scan(tb, lo, hi)))
						require.Positive(t, n)
						if !readOnly {
							// Write skew's other half: what the scan decided goes elsewhere.
							require.NoError(t, tx.Put(other, oid, u64Row(64, uint64(n))))
						}
						c.do(t, tb, ids, k)
						err := tx.Commit()
						if c.conflict {
							require.ErrorIs(t, err, ErrConflict, "read-only %v", readOnly)
						} else {
							require.NoError(t, err, "read-only %v", readOnly)
						}
					}
				})
			}
		}
	}
}

// TestTableScanSkipsEmpty deletes the rows of most pages, reopens cold, and scans through a
// store that counts its calls: only the pages that hold rows are read.
func TestTableScanSkipsEmpty(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	db := openDB(t, ctx, Options{Dir: dir, SyncMode: "none"})
	tb := newTable(t, ctx, db, "sparse", 64)
	const pages = 100
	ids := insertRows(t, db, tb, pages*64)
	var keep []uint64
	for lo := 0; lo < len(ids); lo += 64 {
		page := lo / 64
		if page < 10 || page >= 90 || page == 50 {
			keep = append(keep, ids[lo:lo+64]...)
			continue
		}
		require.NoError(t, db.Update(ctx, func(tx *Tx) error {
			for _, id := range ids[lo : lo+64] {
				if err := tx.Delete(tb, id); err != nil {
					return err
				}
			}
			return nil
		}))
	}
	require.NoError(t, db.Close(ctx))

	cs := &countingStore{Store: newLocalStore(t, dir)}
	db = openDB(t, ctx, Options{Store: cs})
	defer db.Close(ctx)
	tb = openTable(t, ctx, db, "sparse")
	cs.reset()
	require.Equal(t, keep, scanIDs(t, tb.Scan(ctx, 0, math.MaxUint64)))
	const full = 10 + 10 + 1
	t.Logf("page directory calls %d, reads %d of %d pages", cs.pageDirs.Load(), cs.reads.Load(), cs.readPages.Load())
	require.Positive(t, cs.pageDirs.Load())
	require.Equal(t, int64(full), cs.readPages.Load(), "only pages with rows are read")
	require.LessOrEqual(t, cs.reads.Load(), int64(full/scanDirBatch+2), "pages are read in groups")

	// An empty range: no page read at all.
	cs.reset()
	require.Empty(t, scanIDs(t, tb.Scan(ctx, ids[20*64], ids[40*64])))
	require.Zero(t, cs.readPages.Load())
	// Cached now: scanning again reads nothing.
	cs.reset()
	require.Len(t, scanIDs(t, tb.Scan(ctx, 0, math.MaxUint64)), len(keep))
	require.Zero(t, cs.readPages.Load())
}
