package storenode

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
)

// TestVerifyFindsBrokenInvariants shows each check of Engine.verify can fail: one broken
// counter, map entry or window at a time on a store with dirty frames, published pages and an
// owner window, each restored before the next.
func TestVerifyFindsBrokenInvariants(t *testing.T) {
	e := openTest(t, Options{})
	info, g := ownedTable(t, e, "items", 64, testOwner, testGrantPages)
	fences := []base.Fence{{Table: info.ID, Epoch: g.Epoch}}
	commit := func(seq, id uint64) {
		commitWait(t, e, &base.Batch{Owner: testOwner, Seq: seq, Fences: fences,
			Segments: []base.Segment{oneRow(info.ID, id, row64(seq))}})
	}
	for seq := uint64(1); seq <= 3; seq++ {
		commit(seq, seq*uint64(1000))
	}
	require.NoError(t, e.Checkpoint())
	commit(4, 1)
	require.NoError(t, e.verify())

	tb := e.tables[info.ID]
	o := e.owners[testOwner]
	breaks := map[string]func() func(){
		"usedBytes": func() func() { e.cache.usedBytes++; return func() { e.cache.usedBytes-- } },
		"dirtyFrames": func() func() {
			e.cache.dirtyFrames++
			return func() { e.cache.dirtyFrames-- }
		},
		"index": func() func() {
			e.cache.index.set(1<<40, 0)
			return func() { e.cache.index.del(1 << 40) }
		},
		"index bytes": func() func() {
			e.cache.index.bytes++
			return func() { e.cache.index.bytes-- }
		},
		"index count": func() func() {
			e.cache.index.n++
			return func() { e.cache.index.n-- }
		},
		"free disk page referenced": func() func() {
			var d uint64
			for _, ent := range tb.pages.all() {
				if ent.disk != 0 {
					d = uint64(ent.disk - 1)
				}
			}
			tb.used.Clear(d)
			return func() { tb.used.Set(d) }
		},
		"used disk page unreferenced": func() func() {
			d, _ := tb.used.NextClear(0)
			tb.used.Set(d)
			return func() { tb.used.Clear(d) }
		},
		"window seq": func() func() {
			o.window[o.lastSeq%dedupWindow].seq++
			return func() { o.window[o.lastSeq%dedupWindow].seq-- }
		},
		"lease beyond one duration": func() func() {
			until := tb.leaseUntil
			tb.leaseUntil = until.Add(e.opts.LeaseDuration + time.Second)
			return func() { tb.leaseUntil = until }
		},
		"holder without epoch": func() func() {
			epoch := tb.epoch
			tb.epoch = 0
			return func() { tb.epoch = epoch }
		},
		"window size": func() func() {
			n := o.n
			o.n = dedupWindow + 1
			return func() { o.n = n }
		},
	}
	for name, brk := range breaks {
		e.mu.Lock()
		undo := brk()
		e.mu.Unlock()
		require.Error(t, e.verify(), name)
		e.mu.Lock()
		undo()
		e.mu.Unlock()
		require.NoError(t, e.verify(), name)
	}
}
