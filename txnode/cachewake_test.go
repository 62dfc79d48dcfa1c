package txnode

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

var spinSink atomic.Int64

// TestCacheWaiterNotMissed: a pin that finds the cache full and waits is woken by an unpin
// that races with its look for a free frame. The unpin used to check for waiters before the
// pin had registered as one, after the pin had seen the frame still pinned: the pin then slept
// until CacheWait ran out (found as a 10 s stall of a WriteBack linearizability run).
func TestCacheWaiterNotMissed(t *testing.T) {
	rounds := 20000
	if testing.Short() {
		rounds = 2000
	}
	// The smallest budget that holds two frames of 64-byte rows with all the cache's memory.
	budget := 2 * frameCost(64)
	for newPageCache(budget, time.Hour).framesMax(64) < 2 {
		budget += 64
	}
	c := newPageCache(budget, time.Hour)
	if c.framesMax(64) != 2 {
		t.Fatalf("budget %d holds %d frames", budget, c.framesMax(64))
	}
	ctx := context.Background()
	_, held, err := c.pin(ctx, pageKey(1, 0), 64, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, other, err := c.pin(ctx, pageKey(1, 1), 64, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.unpin(other)
	type result struct {
		m   *frameMeta
		err error
	}
	got := make(chan result, 1)
	started := make(chan struct{})
	for i := range rounds {
		key := pageKey(2, uint64(i))
		go func() {
			started <- struct{}{}
			_, m, err := c.pin(ctx, key, 64, 0, 0)
			got <- result{m, err}
		}()
		<-started
		for range i % 512 { // spread the unpin over the pin's look (a few microseconds)
			spinSink.Add(1)
		}
		c.unpin(held) // races with the pin's look: it must be woken either way
		r := recvWithin(t, got, "a pin woken by an unpin")
		if r.err != nil {
			t.Fatal(r.err)
		}
		held = r.m
	}
	c.unpin(held)
}
