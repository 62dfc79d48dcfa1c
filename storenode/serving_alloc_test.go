//go:build !race

package storenode

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
)

// The event loop's read of cached pages allocates nothing when its buffers have room: the
// seam between the engine and the server (storenode/server) costs no allocation.
func TestReadCachedAllocs(t *testing.T) {
	e, table := servingEngine(t)
	wants := []base.PageWant{{Table: table, Page: 0, Want: 0b1111}}
	segs := make([]base.Segment, 1)
	buf := make([]byte, 0, 4*64)
	allocs := testing.AllocsPerRun(100, func() {
		_, ok := e.ReadCached(testOwner, wants, segs, buf[:0])
		if !ok {
			panic("not answered from the cache")
		}
	})
	require.Zero(t, allocs)
}
