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
	// Keys in their bucket's primary row (most of them) take the fast path; the others read
	// their chain in a transaction, which allocates.
	var keys [][]byte
	var ids []uint64
	for i := range 2000 {
		in, err := f.names.InPrimaryForTest(ctx, playerName(i))
		require.NoError(t, err)
		if in {
			keys, ids = append(keys, playerName(i)), append(ids, f.ids[i])
		}
	}
	require.Greater(t, len(keys), 1500)
	n := 0
	// AllocsPerRun counts every goroutine's allocations, and the embedded store's background
	// work (a checkpoint after the fixture's inserts) allocates in bursts: a real allocation
	// per Lookup shows in every attempt, a burst in one.
	var allocs float64
	for range 5 {
		allocs = testing.AllocsPerRun(500, func() {
			n++
			id, err := f.names.Lookup(ctx, keys[n%len(keys)])
			if err != nil || id != ids[n%len(keys)] {
				t.Fatal(id, err)
			}
		})
		if allocs == 0 {
			break
		}
	}
	require.Zero(t, allocs)
}
