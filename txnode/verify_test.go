package txnode

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestVerifyFindsBrokenInvariants shows each check of DB.verify can fail: one broken counter,
// page-table entry or batch at a time on a DB with cached pages, each restored before the next.
func TestVerifyFindsBrokenInvariants(t *testing.T) {
	ctx := context.Background()
	db := openConfigs(t)[0].opener(t)(Options{CacheBytes: 1 << 20})
	tb := newTable(t, ctx, db, "items", 64)
	for v := range uint64(200) {
		insertRow(t, ctx, tb, u64Row(64, v))
	}
	require.NoError(t, db.verify())

	c, p := db.cache, db.pipe
	var frame *frameMeta
	for id := range c.nFrames {
		if m := c.meta(id); m.key.Load() != 0 {
			frame = m
			break
		}
	}
	require.NotNil(t, frame)
	breaks := map[string]func() func(){
		"usedBytes": func() func() { c.usedBytes++; return func() { c.usedBytes-- } },
		"pins":      func() func() { frame.pins.Add(-1); return func() { frame.pins.Add(1) } },
		"page table": func() func() {
			key := frame.key.Load()
			frame.key.Store(key + 1<<20)
			return func() { frame.key.Store(key) }
		},
		"free list": func() func() {
			c.free = append(c.free, c.free...)
			c.free = append(c.free, 0)
			return func() { c.free = c.free[:len(c.free)/2] }
		},
		"seq order": func() func() {
			// In flight seqs increase below nextSeq (a gap is legal: a prepare takes a seq).
			p.inflight = append(p.inflight, &batch{seq: p.nextSeq})
			return func() { p.inflight = p.inflight[:len(p.inflight)-1] }
		},
	}
	for name, brk := range breaks {
		p.mu.Lock() // the pipeline's mutex, then the cache's (db.go)
		c.mu.Lock()
		undo := brk()
		c.mu.Unlock()
		p.mu.Unlock()
		broken := db.verify()
		p.mu.Lock()
		c.mu.Lock()
		undo() // before any assertion: a broken pipeline left in place hangs Close
		c.mu.Unlock()
		p.mu.Unlock()
		require.Error(t, broken, name)
		require.NoError(t, db.verify(), name)
	}
}
