package txnode

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/testseed"
)

// recountBytes is recountBytesLocked (verify.go) under the cache's mutex.
func recountBytes(c *pageCache) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.recountBytesLocked()
}

// TestCacheBytesUnderChurn: the cache's accounted bytes stay equal to what it holds, and
// within budget, while goroutines pin and unpin pages of five row sizes (frames change size)
// and tables are dropped under them (zombie frames).
func TestCacheBytesUnderChurn(t *testing.T) {
	// Most pins of a full cache wait for room (up to waitMax): the test's time is those waits,
	// and 2000 rounds of 4 goroutines drop, unpin and evict all five tables many times over.
	rounds := testseed.Scaled(1000, 2000, 5000)
	c := newPageCache(600<<10, 50*time.Millisecond)
	sizes := []int{8, 64, 256, 1024, 4096}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 1))
			var held []*frameMeta
			for i := 0; i < rounds; i++ {
				switch r.IntN(10) {
				case 0:
					c.dropTable(uint32(1 + r.IntN(5)))
				case 1, 2, 3:
					for _, m := range held {
						c.unpin(m)
					}
					held = held[:0]
				default:
					tb := 1 + r.IntN(5)
					_, m, err := c.pin(context.Background(), pageKey(uint32(tb), uint64(r.IntN(20))), sizes[tb-1], 0, 0)
					if err == nil {
						held = append(held, m)
					}
				}
			}
			for _, m := range held {
				c.unpin(m)
			}
		}()
	}
	wg.Wait()
	require.Equal(t, recountBytes(c), c.bytesUsed())
	require.LessOrEqual(t, c.bytesUsed(), c.budgetBytes)
	require.NoError(t, c.verify())
}
