package txnode

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestCacheTurnAPI: Wait refuses a transaction that was not sent back (it is left as is);
// Hold without the turn held does nothing; Release without it is a no-op, and with it gives
// the turn back (another loop can take it at once).
func TestCacheTurnAPI(t *testing.T) {
	ctx := context.Background()
	db, err := Open(ctx, Options{Dir: t.TempDir()})
	require.NoError(t, err)
	defer db.Close(ctx)
	tx, err := db.Begin(ctx, true)
	require.NoError(t, err)
	defer tx.Rollback()
	require.False(t, tx.cacheBusy())
	var c cacheTurn
	require.ErrorIs(t, c.wait(tx), errNotBusy)
	require.False(t, tx.done, "left as is")
	c.hold(tx)
	require.False(t, tx.turn)
	c.releaseLoop()

	// Held: a busy transaction's Wait takes the turn; Hold gives it to the next attempt.
	tx.busy = busyPage{t: &tableState{}}
	require.NoError(t, c.wait(tx))
	require.True(t, tx.done, "rolled back")
	next, err := db.Begin(ctx, true)
	require.NoError(t, err)
	c.hold(next)
	require.True(t, next.turn)
	next.Rollback()
	c.releaseLoop()
	require.NoError(t, db.cache.takeTurn(ctx, time.Now().Add(time.Minute)), "given back")
	db.cache.giveTurn()
}

// TestCacheTurnReuse: a CacheTurn used again after Release starts a new loop: its CacheWait
// bound counts from the new loop's first Wait, not the old one's. Fails on dc71a4c: the
// first Wait of the second loop fails with ErrCacheFull (the old loop's start kept).
func TestCacheTurnReuse(t *testing.T) {
	ctx := context.Background()
	db, err := Open(ctx, Options{Dir: t.TempDir()})
	require.NoError(t, err)
	defer db.Close(ctx)
	var c cacheTurn
	tx, err := db.Begin(ctx, true)
	require.NoError(t, err)
	tx.busy = busyPage{t: &tableState{}}
	require.NoError(t, c.wait(tx))
	c.Since = c.Since.Add(-2 * db.opts.CacheWait) // the first loop began long ago
	c.releaseLoop()

	tx, err = db.Begin(ctx, true)
	require.NoError(t, err)
	tx.busy = busyPage{t: &tableState{}}
	require.NoError(t, c.wait(tx), "a new loop")
	c.releaseLoop()
}
