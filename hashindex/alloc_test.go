//go:build !race

package hashindex_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLookupAllocs guards the cache-hit Lookup: no allocation.
func TestLookupAllocs(t *testing.T) {
	ctx := context.Background()
	f := newLookupFixture(t, 2000)
	key := playerName(1234)
	// AllocsPerRun counts every goroutine's allocations, and the embedded store's background
	// work (a checkpoint after the fixture's inserts) allocates in bursts: a real allocation
	// per Lookup shows in every attempt, a burst in one.
	var allocs float64
	for range 5 {
		allocs = testing.AllocsPerRun(500, func() {
			id, err := f.names.Lookup(ctx, key)
			if err != nil || id != f.ids[1234] {
				t.Fatal(id, err)
			}
		})
		if allocs == 0 {
			break
		}
	}
	require.Zero(t, allocs)
}
