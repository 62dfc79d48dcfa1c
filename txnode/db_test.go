package txnode

import (
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func openEmbedded(t testing.TB, dir string, opts Options) *DB {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	opts.Dir = dir
	if opts.SyncMode == "" {
		opts.SyncMode = "none"
	}
	db := openDB(t, context.Background(), opts)
	t.Cleanup(func() { db.Close(context.Background()) })
	return db
}

func row(v uint64) []byte {
	b := make([]byte, 64)
	binary.LittleEndian.PutUint64(b, v)
	binary.LittleEndian.PutUint64(b[56:], ^v)
	return b
}

func TestCRUDAndReopen(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	db := openEmbedded(t, dir, Options{})
	items := newTable(t, ctx, db, "items", 64)

	var ids []uint64
	for i := range 300 {
		id := insertRow(t, ctx, items, row(uint64(i)))
		ids = append(ids, id)
	}
	got := make([]byte, 64)
	for i, id := range ids {
		require.NoError(t, items.Get(ctx, id, got))
		require.Equal(t, row(uint64(i)), got)
	}
	require.NoError(t, items.Put(ctx, ids[5], row(500)))
	require.NoError(t, items.Update(ctx, ids[6], func(r []byte) error {
		binary.LittleEndian.PutUint64(r, 600)
		return nil
	}))
	require.NoError(t, items.Delete(ctx, ids[7]))
	require.ErrorIs(t, items.Get(ctx, ids[7], got), ErrNotFound)
	require.ErrorIs(t, items.Delete(ctx, ids[7]), ErrNotFound)
	require.ErrorIs(t, items.Put(ctx, ids[7], row(1)), ErrNotFound)
	boom := errors.New("boom")
	require.ErrorIs(t, items.Update(ctx, ids[8], func([]byte) error { return boom }), boom)

	require.NoError(t, db.Close(ctx))

	db2 := openEmbedded(t, dir, Options{})
	items2 := openTable(t, ctx, db2, "items")
	for i, id := range ids {
		err := items2.Get(ctx, id, got)
		switch i {
		case 5:
			require.Equal(t, row(500), got)
		case 6:
			require.Equal(t, uint64(600), binary.LittleEndian.Uint64(got))
		case 7:
			require.ErrorIs(t, err, ErrNotFound)
		default:
			require.NoError(t, err)
			require.Equal(t, row(uint64(i)), got)
		}
	}
	// New ids never reuse old ones.
	id := insertRow(t, ctx, items2, row(9999))
	require.Greater(t, id, ids[len(ids)-1])
}

// openAccounts creates the table "acct" in db with n accounts of balance 100 (row) and
// returns it and their ids.
func openAccounts(t *testing.T, ctx context.Context, db *DB, n int) (*Table, []uint64) {
	t.Helper()
	acct := newTable(t, ctx, db, "acct", 64)
	ids := make([]uint64, n)
	for i := range ids {
		ids[i] = insertRow(t, ctx, acct, row(100))
	}
	return acct, ids
}

// transferAll moves money between the accounts ids of acct: 16 goroutines, rounds transfers
// of 1 each (a pseudo-random pair, never one account to itself), each in its own db.Update;
// with skipEmpty an account at 0 gives nothing. A failed transfer fails the test.
func transferAll(t *testing.T, ctx context.Context, db *DB, acct *Table, ids []uint64, rounds int, skipEmpty bool) {
	n := len(ids)
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, b := make([]byte, 64), make([]byte, 64)
			for i := range rounds {
				from, to := ids[(g*7919+i*31)%n], ids[(g*104729+i*17+1)%n]
				if from == to {
					continue
				}
				err := db.Update(ctx, func(tx *Tx) error {
					if err := getTwo(tx, acct, from, to, a, b); err != nil {
						return err
					}
					va, vb := binary.LittleEndian.Uint64(a), binary.LittleEndian.Uint64(b)
					if skipEmpty && va == 0 {
						return nil
					}
					if err := tx.Put(acct, from, row(va-1)); err != nil {
						return err
					}
					return tx.Put(acct, to, row(vb+1))
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestTransferConserves(t *testing.T) {
	ctx := context.Background()
	for _, mode := range []Durability{Durable, WriteBack} {
		db := openEmbedded(t, "", Options{Durability: mode, CacheBytes: 256 << 10})
		const n = 2000
		acct, ids := openAccounts(t, ctx, db, n)
		transferAll(t, ctx, db, acct, ids, 200, true)
		var total uint64
		err := db.View(ctx, func(tx *Tx) error {
			total = 0
			buf := make([]byte, 64)
			for _, id := range ids {
				if err := tx.Get(acct, id, buf); err != nil {
					return err
				}
				total += binary.LittleEndian.Uint64(buf)
			}
			return nil
		})
		require.NoError(t, err)
		require.Equal(t, uint64(100*n), total, "mode %d", mode)
		st := db.Stats()
		require.LessOrEqual(t, st.CacheBytes, int64(256<<10))
		t.Logf("mode %d: %+v", mode, st)
	}
}

// TestDropTableThroughWrappedStore: DropTable acts for this node's owner id whatever store it
// runs on. On 26994d0 the embedded store learnt the owner only when Open found a bare
// *localStore, so behind a wrapper (every fault-injecting test store) it dropped as owner 0 and
// failed with ErrTableOwned against the node's own live grant.
func TestDropTableThroughWrappedStore(t *testing.T) {
	ctx := context.Background()
	db := openDB(t, ctx, Options{Store: &countingStore{Store: newLocalStore(t, "")}})
	defer db.Close(ctx)
	items := newTable(t, ctx, db, "items", 64)
	insertRow(t, ctx, items, make([]byte, 64))
	require.NoError(t, db.DropTable(ctx, "items"))
	_, err := db.Table(ctx, "items")
	require.ErrorIs(t, err, ErrTableNotFound)
}

// TestCatalogAfterClose: every catalog call after Close returns ErrClosed, on every store.
// Fails on 36b8b47: the embedded DB.Tables listed the closed engine's tables with a nil error
// (the remote store said ErrClosed).
func TestCatalogAfterClose(t *testing.T) {
	ctx := context.Background()
	eachConfig(t, openConfigs(t), Options{}, func(t *testing.T, db *DB) {
		newTable(t, ctx, db, "items", 64)
		require.NoError(t, db.Close(ctx))
		ts, err := db.Tables(ctx)
		require.ErrorIs(t, err, ErrClosed, "Tables")
		require.Empty(t, ts)
		_, err = db.CreateTable(ctx, "other", 64)
		require.ErrorIs(t, err, ErrClosed, "CreateTable")
		_, err = db.Table(ctx, "items")
		require.ErrorIs(t, err, ErrClosed, "Table")
		require.ErrorIs(t, db.DropTable(ctx, "items"), ErrClosed, "DropTable")
	})
}

// TestCatalogDoneContext: a catalog call with a context already done does nothing and returns
// the context's error, on every store (the store seam: every blocking method ends when its
// context does). Fails on 36b8b47: the embedded store ignored the context and created, and
// dropped, the table.
func TestCatalogDoneContext(t *testing.T) {
	ctx := context.Background()
	done, cancel := context.WithCancel(ctx)
	cancel()
	eachConfig(t, openConfigs(t), Options{}, func(t *testing.T, db *DB) {
		_, err := db.CreateTable(done, "items", 64)
		require.ErrorIs(t, err, context.Canceled, "CreateTable")
		_, err = db.Table(ctx, "items")
		require.ErrorIs(t, err, ErrTableNotFound, "nothing was created")
		newTable(t, ctx, db, "items", 64)
		newTable(t, ctx, db, "free", 64)
		_, err = db.Tables(done)
		require.ErrorIs(t, err, context.Canceled, "Tables")
		require.ErrorIs(t, db.DropTable(done, "items"), context.Canceled, "DropTable of an open table")
		require.ErrorIs(t, db.DropTable(done, "free2"), context.Canceled, "DropTable of a name this node has not opened (none such)")
		ts, err := db.Tables(ctx)
		require.NoError(t, err)
		require.Len(t, ts, 2, "nothing was dropped")
	})
}
