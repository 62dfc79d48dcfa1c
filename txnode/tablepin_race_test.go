package txnode

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestTablePinConcurrent pins, unpins and drops tables while other goroutines read, update,
// insert and scan them in a small cache: every call either works or fails with an error of
// the documented kinds, the pins' invariants hold throughout (checked under the cache's
// mutex by a checker goroutine), and once all is done no frame is left pinned.
func TestTablePinConcurrent(t *testing.T) {
	rounds := 60
	if testing.Short() {
		rounds = 15
	}
	for _, cfg := range openConfigs(t)[1:3] { // embedded/writeback and remote/durable
		t.Run(cfg.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			db := cfg.opener(t)(Options{CacheBytes: 512 << 10, CacheWait: 5 * time.Second})
			var mu sync.Mutex // guards tables
			tables := map[string]*Table{}
			mk := func(name string) {
				tb := newTable(t, ctx, db, name, 64)
				fillTable(t, ctx, db, tb, 1+rand.IntN(4), 0)
				mu.Lock()
				tables[name] = tb
				mu.Unlock()
			}
			for i := range 4 {
				mk(fmt.Sprintf("t%d", i))
			}
			pick := func(rng *rand.Rand) *Table {
				mu.Lock()
				defer mu.Unlock()
				for _, tb := range tables { // map order: random enough
					if rng.IntN(2) == 0 {
						return tb
					}
				}
				for _, tb := range tables {
					return tb
				}
				return nil
			}
			okErr := func(err error) bool {
				return err == nil || errors.Is(err, ErrNotFound) || errors.Is(err, ErrTableNotFound) ||
					errors.Is(err, ErrPinBudget) || errors.Is(err, ErrCacheFull) || errors.Is(err, errUnpinned)
			}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			errc := make(chan error, 16)
			for w := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(w), 9))
					buf := make([]byte, 64)
					for {
						select {
						case <-stop:
							return
						default:
						}
						tb := pick(rng)
						var err error
						switch rng.IntN(4) {
						case 0:
							err = tb.Get(ctx, rng.Uint64N(512), buf)
						case 1:
							err = tb.Update(ctx, rng.Uint64N(512), func(r []byte) error { r[0]++; return nil })
						case 2:
							_, err = tb.Insert(ctx, u64Row(64, 1))
						default:
							for _, e := range tb.Scan(ctx, 0, 1024) {
								if e != nil {
									err = e
									break
								}
							}
						}
						if !okErr(err) {
							errc <- err
							return
						}
					}
				}()
			}
			wg.Add(1)
			go func() { // the checker
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					c := db.cache
					c.mu.Lock()
					var bytes int64
					for _, p := range c.tp.byTable {
						for key, m := range p.frames {
							if m.key.Load() != key || m.pins.Load() < 1 {
								c.mu.Unlock()
								errc <- fmt.Errorf("pinned frame of key %#x holds %#x, %d pins", key, m.key.Load(), m.pins.Load())
								return
							}
						}
						bytes += int64(len(p.frames)) * frameCost(p.rowBytes)
					}
					bad := bytes != c.tp.bytes || c.tp.bytes > c.tp.budget || c.usedBytes > c.budgetBytes
					c.mu.Unlock()
					if bad {
						errc <- errors.New("pin accounting off")
						return
					}
				}
			}()
			rng := rand.New(rand.NewPCG(3, 4))
			for r := range rounds {
				tb := pick(rng)
				switch rng.IntN(5) {
				case 0, 1:
					if err := tb.Pin(ctx); !okErr(err) {
						require.NoError(t, err)
					}
				case 2, 3:
					tb.Unpin()
				default:
					name := tb.Name()
					require.NoError(t, db.DropTable(ctx, name))
					mu.Lock()
					delete(tables, name)
					mu.Unlock()
					mk(fmt.Sprintf("n%d", r))
				}
				select {
				case err := <-errc:
					require.NoError(t, err)
				default:
				}
			}
			close(stop)
			wg.Wait()
			select {
			case err := <-errc:
				require.NoError(t, err)
			default:
			}
			mu.Lock()
			for _, tb := range tables {
				tb.Unpin()
			}
			mu.Unlock()
			require.NoError(t, db.pipe.flush(ctx))
			c := db.cache
			c.mu.Lock()
			defer c.mu.Unlock()
			require.Zero(t, c.tp.bytes)
			require.Empty(t, c.tp.byTable)
			for id := range c.nFrames {
				require.Zero(t, c.meta(id).pins.Load(), "frame %d still pinned", id)
			}
		})
	}
}
