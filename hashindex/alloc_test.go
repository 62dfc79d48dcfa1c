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
	allocs := testing.AllocsPerRun(200, func() {
		id, err := f.names.Lookup(ctx, key)
		if err != nil || id != f.ids[1234] {
			t.Fatal(id, err)
		}
	})
	require.Zero(t, allocs)
}
