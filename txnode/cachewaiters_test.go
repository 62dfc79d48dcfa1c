package txnode

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Waiters for a frame that hold frames may together hold at most all but one of the frames
// the budget can make, counted with the cache's overhead (metadata chunks, page table). The
// old cap, the budget less 1/8, let two waiters in a 64 KiB cache hold all 11 frames between
// them and wait for each other for the whole CacheWait (TestTinyCacheProgress hung about
// once in 20 runs after the page-table slots grew to 32 bytes). Fails on main f769063: the
// second waiter waits instead of being sent back.
func TestWaitersLeaveAFrame(t *testing.T) {
	c := newPageCache(minCacheBytes, time.Minute)
	cost := frameCost(64)
	frames := int64(0)
	for c.canHold(frames+1, (frames+1)*cost) {
		frames++
	}
	require.Greater(t, frames, int64(2))
	ctx := context.Background()
	for p := range uint64(frames) { // every frame the cache can make, pinned by running transactions
		_, _, err := c.pin(ctx, pageKey(1, p), 64, 0, 0)
		require.NoError(t, err)
	}
	// One waiter claims all frames but one: it may wait (the last one is another's and will
	// be unpinned).
	first, cancel := context.WithCancel(ctx)
	defer cancel()
	waited := make(chan error, 1)
	go func() {
		_, _, err := c.pin(first, pageKey(1, 1000), 64, 0, int(frames-1))
		waited <- err
	}()
	require.Eventually(t, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.waitersHeld == frames-1
	}, 10*time.Second, time.Millisecond, "the first waiter waits")
	// The holder of the last frame must not wait too: it is sent back at once.
	bounded, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	_, _, err := c.pin(bounded, pageKey(1, 1001), 64, 0, 1)
	require.True(t, errors.Is(err, errCacheBusy), "the second waiter: %v", err)
	cancel()
	require.ErrorIs(t, <-waited, context.Canceled)
}
