package txnode

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Regression tests from the hostile review of issue 9's merge; each failed on the code before
// its fix.

// TestWorkingSetOfMixedRowSizes: a transaction holding three pages of 8-byte rows that needs
// one page of 4096-byte rows, in a cache that holds three of the big pages (so easily three
// small and one big), waits for room while another caller holds the rest pinned. It was
// failed at once with ErrCacheFull ("the working set does not fit"): the working-set check
// counted its held frames as frames of the row size it wanted.
func TestWorkingSetOfMixedRowSizes(t *testing.T) {
	ctx := context.Background()
	big := frameCost(4096)
	budget := 3 * big
	for newPageCache(budget, time.Hour).framesMax(4096) < 3 {
		budget += 64
	}
	db := openConfigs(t)[0].opener(t)(Options{CacheBytes: budget, CacheWait: time.Hour})
	bt, err := db.CreateTable(ctx, "big", 4096)
	require.NoError(t, err)
	st, err := db.CreateTable(ctx, "small", 8)
	require.NoError(t, err)
	bigIDs := insertRows(t, db, bt, 3*64)
	smallIDs := insertRows(t, db, st, 3*64)

	// Another caller pins two of the big pages: the room left holds one big frame, not one
	// and three small ones.
	ps, err := db.Pin(ctx, bt, bigIDs[0], bigIDs[2*64-1]+1)
	require.NoError(t, err)
	require.Equal(t, 2, ps.Pages())
	released := false
	defer func() {
		if !released {
			ps.Release()
		}
	}()

	res := make(chan error, 1)
	go func() {
		res <- db.View(ctx, func(tx *Tx) error {
			for i := 0; i < 3; i++ {
				if err := tx.Get(st, smallIDs[i*64], make([]byte, 8)); err != nil {
					return err
				}
			}
			return tx.Get(bt, bigIDs[2*64], make([]byte, 4096))
		})
	}()
	waitUntil(t, "the transaction to wait for a frame (or fail)", func() bool {
		select {
		case err := <-res:
			require.NoError(t, err, "a working set that fits")
			require.FailNow(t, "the transaction did not need to wait: the test's cache is too big")
		default:
		}
		return db.cache.waiters.Load() > 0
	})
	ps.Release()
	released = true
	require.NoError(t, recvWithin(t, res, "the transaction, once room was made"))
}
