package hashindex_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/hashindex"
)

// TestTxDirectoryRefreshHonoursTxContext: a transaction whose lookup must refresh a stale
// directory snapshot (another Index handle grew the index) waits for the refresh under the
// transaction's context, so a cancelled transaction returns instead of waiting for ever.
func TestTxDirectoryRefreshHonoursTxContext(t *testing.T) {
	ctx := context.Background()
	db := openDB(t, t.TempDir())
	defer func() { db.Close(ctx) }()
	grower, err := hashindex.Create(ctx, db, "names", hashindex.Options{KeyBytes: 8, Unique: true, RowBytes: 64})
	require.NoError(t, err)
	stale, err := hashindex.Open(ctx, db, "names") // one bucket in its snapshot
	require.NoError(t, err)
	n := 400
	for i := range n {
		require.NoError(t, grower.Insert(ctx, key8(i), uint64(i)+1))
	}
	release := stale.HoldDirForTest() // a refresh in progress, stuck
	released := false
	defer func() {
		if !released {
			release()
		}
	}()
	// Every key not in bucket 0 makes the stale handle refresh; most keys are not in it.
	for i := range 16 {
		tctx, cancel := context.WithCancel(ctx)
		tx, err := db.Begin(tctx, false)
		require.NoError(t, err)
		cancel()
		done := make(chan error, 1)
		go func() {
			_, err := stale.TxLookup(tx, key8(i))
			done <- err
		}()
		select {
		case err := <-done:
			tx.Rollback()
			if err == nil {
				continue // bucket 0: no refresh needed
			}
			require.ErrorIs(t, err, context.Canceled)
			return
		case <-time.After(10 * time.Second):
			release()
			released = true
			err := <-done
			tx.Rollback()
			t.Fatalf("TxLookup of a cancelled transaction waited for the refresh lock (then returned %v)", err)
		}
	}
	t.Fatal(errors.New("no key needed a refresh"))
}
