package txnode

import (
	"context"
	"encoding/binary"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/storenode/server"
)

// startStorageNode runs a storage node on 127.0.0.1:0 over dir and returns its address and a
// function that stops it.
func startStorageNode(t testing.TB, dir string) (string, func()) {
	t.Helper()
	return startStorageNodeWith(t, storenode.Options{Dir: dir, Sync: storenode.SyncNone})
}

func startStorageNodeWith(t testing.TB, opts storenode.Options) (string, func()) {
	t.Helper()
	srv, err := server.New(server.Config{Listen: "127.0.0.1:0", Options: opts})
	require.NoError(t, err)
	require.NoError(t, srv.Start())
	var once sync.Once
	stop := func() { once.Do(func() { require.NoError(t, srv.Shutdown(context.Background())) }) }
	t.Cleanup(stop)
	return srv.Addr().String(), stop
}

func TestRemoteCRUDAndTransfer(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	addr, stop := startStorageNode(t, dir)
	db := openDB(t, ctx, Options{StoreAddr: addr, CacheBytes: 256 << 10, OwnerID: 42})
	require.Equal(t, "none", db.info.SyncMode)
	const n = 3000 // 47 pages: more than the 256 KiB cache keeps with room to spare
	acct, ids := openAccounts(t, ctx, db, n)
	transferAll(t, ctx, db, acct, ids, 150, false)
	sum := func(db *DB, acct *Table) uint64 {
		var total uint64
		for r, err := range acct.Scan(ctx, 0, ^uint64(0)) {
			require.NoError(t, err)
			total += binary.LittleEndian.Uint64(r.Data)
		}
		return total
	}
	require.Equal(t, uint64(100*n), sum(db, acct))
	require.NoError(t, db.Close(ctx))
	stop()

	// The node restarts with its owner id against a restarted storage node: it takes its
	// tables back at once (another owner would wait out the lease) and sees the same state.
	addr2, _ := startStorageNode(t, dir)
	db2 := openDB(t, ctx, Options{StoreAddr: addr2, CacheBytes: 128 << 10, OwnerID: 42})
	defer db2.Close(ctx)
	acct2 := openTable(t, ctx, db2, "acct")
	require.Equal(t, uint64(100*n), sum(db2, acct2))
	other := openDB(t, ctx, Options{StoreAddr: addr2, OwnerID: 43})
	defer other.Close(ctx)
	_, err := other.Table(ctx, "acct")
	require.ErrorIs(t, err, ErrTableOwned)
}

// TestRemoteStorageNodeRestart restarts the storage node under a stream of transfers: the
// node reconnects, resends the batches in flight with their seqs, and loses nothing.
func TestRemoteStorageNodeRestart(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	addr, stop := startStorageNode(t, dir)
	db := openDB(t, ctx, Options{StoreAddr: addr, OwnerID: 7})
	defer db.Close(ctx)
	acct := newTable(t, ctx, db, "acct", 64)
	const n = 500
	ids := make([]uint64, n)
	for i := range ids {
		ids[i] = insertRow(t, ctx, acct, row(100))
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	done := 0
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				from, to := ids[(g*31+i*7)%n], ids[(g*17+i*13+1)%n]
				if from == to {
					continue
				}
				err := db.Update(ctx, func(tx *Tx) error {
					a, b := make([]byte, 64), make([]byte, 64)
					if err := getTwo(tx, acct, from, to, a, b); err != nil {
						return err
					}
					if err := tx.Put(acct, from, row(binary.LittleEndian.Uint64(a)-1)); err != nil {
						return err
					}
					return tx.Put(acct, to, row(binary.LittleEndian.Uint64(b)+1))
				})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				done++
				mu.Unlock()
			}
		}()
	}
	// Restart the storage node once some transfers went through.
	for {
		mu.Lock()
		d := done
		mu.Unlock()
		if d >= 200 {
			break
		}
		require.NoError(t, db.waitDurable(ctx, db.commitVer.Load()))
	}
	stop()
	startStorageNodeAt(t, dir, addr)
	wg.Wait()
	var total uint64
	for r, err := range acct.Scan(ctx, 0, ^uint64(0)) {
		require.NoError(t, err)
		total += binary.LittleEndian.Uint64(r.Data)
	}
	require.Equal(t, uint64(100*n), total)
}

func startStorageNodeAt(t testing.TB, dir, addr string) {
	t.Helper()
	srv, err := server.New(server.Config{
		Listen:  addr,
		Options: storenode.Options{Dir: dir, Sync: storenode.SyncNone},
	})
	require.NoError(t, err)
	require.NoError(t, srv.Start())
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
}
