package txnode

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
)

// checkPinsLocked checks the table pins' invariants (pin.go) against the cache. Caller
// holds c.mu.
func checkPinsLocked(t *testing.T, c *pageCache) {
	t.Helper()
	var bytes int64
	for table, p := range c.tp.byTable {
		require.Equal(t, table, p.table)
		for key, m := range p.frames {
			require.Equal(t, table, uint32(key>>32))
			require.True(t, p.holds(key&(1<<32-1)))
			require.Equal(t, key, m.key.Load(), "a pinned frame lost its page")
			require.Positive(t, m.pins.Load())
			require.Equal(t, int32(p.rowBytes), m.rowBytes)
			_, found := c.lookup(key)
			require.Same(t, m, found, "a pinned frame is not in the page table")
		}
		bytes += int64(len(p.frames)) * frameCost(p.rowBytes)
	}
	require.Equal(t, bytes, c.tp.bytes)
	require.LessOrEqual(t, c.tp.bytes, c.tp.budget)
	require.LessOrEqual(t, c.usedBytes, c.budgetBytes)
}

// TestTablePinModel runs random pins, unpins, reads, scans and inserts over tables of two
// row sizes in a small cache, against a model of which tables are pinned and of every row:
// after each step the pins' invariants hold, a pinned table's pages are all cached (its reads
// never miss), a Pin succeeds exactly when the budget has room for the table's pages, and
// at the end every frame is unpinned.
func TestTablePinModel(t *testing.T) {
	steps := 800
	if testing.Short() {
		steps = 300
	}
	for _, cfg := range openConfigs(t)[:3] {
		t.Run(cfg.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			const cacheBytes = 384 << 10
			db := cfg.opener(t)(Options{CacheBytes: cacheBytes, PinBytes: cacheBytes / 2, CacheWait: 2 * time.Second})
			rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
			type model struct {
				tb     *Table
				rows   map[uint64]uint64 // id -> value
				ids    []uint64
				pinned bool
				pinHi  uint64 // idHigh at the pin
			}
			var ts []*model
			for i, rb := range []int{64, 64, 128, 256} {
				tb, err := db.CreateTable(ctx, "t"+string(rune('a'+i)), rb)
				require.NoError(t, err)
				ts = append(ts, &model{tb: tb, rows: map[uint64]uint64{}})
			}
			insert := func(m *model, n int) {
				require.NoError(t, db.Update(ctx, func(tx *Tx) error {
					for range n {
						v := rng.Uint64()
						id, err := tx.Insert(m.tb, u64Row(m.tb.RowBytes(), v))
						if err != nil {
							return err
						}
						m.rows[id] = v
						m.ids = append(m.ids, id)
					}
					return nil
				}))
			}
			for _, m := range ts {
				insert(m, 64*(1+rng.IntN(6)))
			}
			pinnedBytes := func() int64 {
				var b int64
				for _, m := range ts {
					if m.pinned {
						b += int64(m.tb.Stats().PinnedPages) * frameCost(m.tb.RowBytes())
					}
				}
				return b
			}
			for step := range steps {
				m := ts[rng.IntN(len(ts))]
				switch op := rng.IntN(10); {
				case op == 0: // pin
					if m.pinned {
						require.NoError(t, m.tb.Pin(ctx))
						break
					}
					hi := m.tb.t.idHigh.Load()
					need := int64((hi+63)/64) * frameCost(m.tb.RowBytes())
					fits := pinnedBytes()+need <= db.opts.PinBytes
					err := m.tb.Pin(ctx)
					if fits {
						require.NoError(t, err, "step %d", step)
						m.pinned, m.pinHi = true, hi
					} else {
						require.ErrorIs(t, err, ErrPinBudget, "step %d", step)
					}
				case op == 1: // unpin
					m.tb.Unpin()
					m.pinned = false
				case op <= 5: // reads
					buf := make([]byte, m.tb.RowBytes())
					misses := m.tb.Stats().Misses
					for range 20 {
						id := m.ids[rng.IntN(len(m.ids))]
						if rng.IntN(2) == 0 {
							require.NoError(t, m.tb.Get(ctx, id, buf))
						} else {
							require.NoError(t, db.View(ctx, func(tx *Tx) error { return tx.Get(m.tb, id, buf) }))
						}
						require.Equal(t, m.rows[id], checkRow(t, buf))
					}
					if m.pinned && m.pinHi >= m.tb.t.idHigh.Load() {
						require.Equal(t, misses, m.tb.Stats().Misses, "step %d: a pinned table's read missed", step)
					}
				case op <= 7: // a scan
					n := 0
					for row, err := range m.tb.Scan(ctx, 0, ^uint64(0)) {
						require.NoError(t, err)
						require.Equal(t, m.rows[row.ID], checkRow(t, row.Data))
						n++
					}
					require.Equal(t, len(m.rows), n)
				default:
					if len(m.rows) < 64*12 {
						insert(m, 1+rng.IntN(64))
					}
				}
				c := db.cache
				c.mu.Lock()
				checkPinsLocked(t, c)
				require.NoError(t, c.verifyPinsLocked())
				for _, m := range ts {
					p := c.tp.byTable[m.tb.t.id]
					require.Equal(t, m.pinned, p != nil, "step %d", step)
					if m.pinned {
						p.pagesBelow(m.pinHi, func(page uint64) bool {
							_, ok := p.frames[pageKey(m.tb.t.id, page)]
							require.True(t, ok, "step %d: page %d of a pinned table not held", step, page)
							return true
						})
					}
				}
				c.mu.Unlock()
			}
			for _, m := range ts {
				m.tb.Unpin()
			}
			require.NoError(t, db.pipe.flush(ctx))
			c := db.cache
			c.mu.Lock()
			defer c.mu.Unlock()
			require.Zero(t, c.tp.bytes)
			for id := range c.nFrames {
				require.Zero(t, c.meta(id).pins.Load(), "frame %d still pinned", id)
			}
		})
	}
}

// TestTablePinPartitionPages: a cluster-managed table's pin holds only its partition's
// pages (pagesBelow and holds agree with cluster.Layout.OfPage's rule).
func TestTablePinPartitionPages(t *testing.T) {
	p := &tablePin{layout: base.ClusterLayout{Partitions: 3, StripePages: 2, Partition: 1}}
	var got []uint64
	p.pagesBelow(17*64+1, func(page uint64) bool { got = append(got, page); return true })
	require.Equal(t, []uint64{2, 3, 8, 9, 14, 15}, got)
	for page := range uint64(40) {
		require.Equal(t, page/2%3 == 1, p.holds(page), "page %d", page)
	}
	local := &tablePin{}
	got = nil
	local.pagesBelow(3*64, func(page uint64) bool { got = append(got, page); return page < 1 })
	require.Equal(t, []uint64{0, 1}, got)
}

// TestVerifyPinsCatches: the invariant check finds a miscounted pin budget and a pinned
// frame without its pin.
func TestVerifyPinsCatches(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db := openConfigs(t)[0].opener(t)(Options{})
	tb := newTable(t, ctx, db, "t", 64)
	fillTable(t, ctx, db, tb, 1, 0)
	require.NoError(t, tb.Pin(ctx))
	c := db.cache
	c.mu.Lock()
	defer c.mu.Unlock()
	require.NoError(t, c.verifyPinsLocked())
	c.tp.bytes++
	require.ErrorContains(t, c.verifyPinsLocked(), "table pins hold")
	c.tp.bytes--
	for _, m := range c.tp.byTable[tb.t.id].frames {
		m.pins.Add(-1)
		require.ErrorContains(t, c.verifyPinsLocked(), "pins")
		m.pins.Add(1)
	}
	require.NoError(t, c.verifyPinsLocked())
}
