package txnode

import (
	"context"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/logicpage"
)

// Cache misses. A random miss fetches only the missing rows of its page (64 bytes for a
// 64-byte row); a run of misses (a second miss in a page, or a miss in the page after one that
// missed recently), and scans, fetch whole pages. Runs are told per reader, not per table:
// many goroutines reading their own sequences interleave their misses. Requests of many
// goroutines share frames on the wire (the remote store batches them). A fill writes only
// slots that are still invalid, so a commit that landed while the miss was in flight is never
// overwritten by the older bytes from the store.

// missRunSlots is the size of a table's table of recent misses: enough for that many
// interleaved sequential readers to be told apart, at 8 bytes a slot.
const missRunSlots = 256

// missRuns remembers a table's recent miss pages, each in the slot its successor hashes to
// (slot (p+1) mod missRunSlots holds p), so a miss on page p finds in O(1) whether p-1 or p
// itself missed recently. Slots are overwritten freely: a collision costs a run's next page
// one sparse fetch, never correctness.
type missRuns struct {
	slots [missRunSlots]atomic.Uint64
}

func (r *missRuns) init() {
	for i := range r.slots {
		r.slots[i].Store(^uint64(0))
	}
}

// miss records a miss on page and reports whether it continues a run.
func (r *missRuns) miss(page uint64) bool {
	self := &r.slots[(page+1)%missRunSlots]
	run := self.Load() == page || (page > 0 && r.slots[page%missRunSlots].Load() == page-1)
	if !run || self.Load() != page {
		self.Store(page)
	}
	return run
}

// fetch makes the slots of want in the pinned frame m valid.
func (db *DB) fetch(ctx context.Context, t *tableState, m *frameMeta, page, want uint64) error {
	valid := m.valid.Load()
	need := want &^ valid
	if t.runs.miss(page) || db.opts.FullPageIO {
		want = ^valid // a sequential run (or the full-page ablation): take the whole page
	}
	missing := want &^ valid
	if missing == 0 {
		return nil
	}
	if v, ghostMask := db.cache.ghostOf(m); v != 0 && missing&ghostMask != 0 {
		// Rows of missing were in flight when the page's frame was evicted: the store may
		// answer with their older images until their batches are acknowledged (cache.go).
		// Rows only read ahead are left for later; rows asked for are waited for.
		if need&ghostMask == 0 && !db.opts.FullPageIO {
			if missing &^= ghostMask; missing == 0 {
				return nil
			}
		} else if err := db.pipe.waitSettled(ctx, v); err != nil {
			return err
		}
	}
	db.cache.misses.Add(1)
	t.cnt.misses.Add(1)
	db.stats.rowsFetched.Add(uint64(bits.OnesCount64(missing)))
	f := fetchPool.Get().(*fetchReq)
	f.db, f.t, f.m = db, t, m
	f.reqs[0] = base.PageWant{Table: t.id, Page: page, Want: missing}
	err := db.store.Read(ctx, f.reqs[:], f.fillFn)
	*f = fetchReq{fillFn: f.fillFn} // Read has returned: fill runs no more (an abandoned read's reply is dropped)
	fetchPool.Put(f)
	return err
}

// fetchReq is one fetch's request and fill callback, pooled so that a miss allocates no
// closure.
type fetchReq struct {
	db     *DB
	t      *tableState
	m      *frameMeta
	reqs   [1]base.PageWant
	fillFn func(int, uint64, uint64, []byte) // f.fill, made once
}

var fetchPool = sync.Pool{New: func() any {
	f := &fetchReq{}
	f.fillFn = f.fill
	return f
}}

func (f *fetchReq) fill(_ int, data, clear uint64, rows []byte) {
	f.db.fill(f.t, f.m, data, clear, rows)
}

// fill writes a store's answer into frame m, only into slots still invalid and not locked. It
// never waits (it runs on the remote store's receiver goroutine).
func (db *DB) fill(t *tableState, m *frameMeta, data, clear uint64, rows []byte) {
	versions, frameRows := frameWords(m, t.rowBytes)
	r := t.rowBytes
	ver, fresh := db.durableVer.Load(), uint64(0)
	k := 0
	for mask := data | clear; mask != 0; mask &= mask - 1 {
		slot := bits.TrailingZeros64(mask)
		bit := uint64(1) << slot
		var src []byte
		if data&bit != 0 {
			src = rows[k*r : (k+1)*r]
			k++
		}
		if m.valid.Load()&bit != 0 {
			continue
		}
		// fill may run on a connection's receiver goroutine, which must never wait: a slot
		// locked by a committer (who may itself wait for acknowledgements that only the
		// receiver delivers) or by another fill is skipped. The locker makes it valid, or
		// leaves it invalid for the reader to fetch again (see Tx.readRow).
		word := &versions[slot]
		v := atomic.LoadUint64(word)
		if v&versionLock != 0 || !atomic.CompareAndSwapUint64(word, v, v|versionLock) {
			continue
		}
		if m.valid.Load()&bit != 0 {
			atomic.StoreUint64(word, v) // filled meanwhile: leave it as it is
			db.cache.rows.wake(m, slot)
			continue
		}
		{
			dst := frameRows[slot*r : (slot+1)*r]
			if src != nil {
				logicpage.StoreRow(dst, src)
				m.present.Or(bit)
			} else {
				m.present.And(^bit)
			}
			m.valid.Or(bit)
		}
		if db.batchFailed.Load() {
			// A batch failed: this slot may be one its invalidation left, and the store may
			// hold the batch all the same (applied, its acknowledgement lost; or
			// acknowledged after an earlier batch failed). The durable version is then not
			// the state of the store's bytes, and the row may have had it with its older
			// bytes: stamp a version no row ever had, from the commit counter (the flag is
			// loaded after the slot's valid bit, so after the invalidation, which follows
			// it), so that a version still identifies a row's bytes (Table.ViewVersion).
			// It is past the failed version: a Durable read of it returns the failure.
			if fresh == 0 {
				fresh = db.commitVer.Add(1)
			}
			ver = fresh
		}
		atomic.StoreUint64(word, ver)
		db.cache.rows.wake(m, slot)
	}
}

// appendRows appends the rows of mask from a frame's rows to dst, copying with atomic loads.
func appendRows(dst, rows []byte, r int, mask uint64) []byte {
	for ; mask != 0; mask &= mask - 1 {
		slot := bits.TrailingZeros64(mask)
		n := len(dst)
		dst = slices.Grow(dst, r)[:n+r]
		logicpage.LoadRow(dst[n:], rows[slot*r:(slot+1)*r])
	}
	return dst
}
