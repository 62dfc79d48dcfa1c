package txnode

import (
	"context"
	"sync"

	"github.com/weftdb/weft/logicpage"
)

// idAllocator hands out a table's new row ids from whole pages granted by the store, so
// concurrent inserts fill pages densely (and cross the wire as full pages). Grants grow from
// one page to idGrantPagesMax as inserts keep coming. Ids are never reused: an id taken and
// then rolled back stays a hole.
type idAllocator struct {
	table *tableState

	mu         sync.Mutex // serializes take (not held across the store's AllocIDs)
	grantPages int
	// granting is closed when the grant in progress (the store's AllocIDs, a round trip)
	// ends; nil when none. Others wait for it on the channel, within their contexts.
	granting chan struct{}
	// stateMu guards next and end (written by take, under mu): freshOf reads them from the
	// cache's frame creation, which holds the cache's mutex and must not wait for a grant.
	stateMu   sync.Mutex
	next, end uint64
}

const idGrantPagesMax = 256

// take returns a new row id, asking the store for more pages when the grant is used up, and
// fresh: the slots of the id's page whose ids are not handed out yet, so hold no row anywhere.
// Slots handed out before may hold rows that reached the store and left the cache.
func (a *idAllocator) take(ctx context.Context, db *DB) (id, fresh uint64, err error) {
	a.mu.Lock()
	for a.next == a.end {
		if ch := a.granting; ch != nil {
			// Another take is asking the store: wait for it within ctx, then look again.
			a.mu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
				return 0, 0, ctx.Err()
			}
			a.mu.Lock()
			continue
		}
		ch := make(chan struct{})
		a.granting = ch
		a.grantPages = min(max(1, a.grantPages*2), idGrantPagesMax)
		pages := a.grantPages
		a.mu.Unlock()
		first, count, err := db.store.AllocIDs(ctx, a.table.id, db.owner, a.table.epoch.Load(), pages)
		a.mu.Lock()
		a.granting = nil
		close(ch)
		if err != nil {
			a.mu.Unlock()
			a.table.noteFenced(err)
			return 0, 0, err
		}
		if first < a.table.grantLo.Load() {
			a.table.grantLo.Store(first)
		}
		a.stateMu.Lock()
		a.next, a.end = first, first+count
		a.stateMu.Unlock()
		if a.end > a.table.idHigh.Load() {
			a.table.idHigh.Store(a.end)
		}
		db.stats.idGrants.Add(1)
	}
	defer a.mu.Unlock()
	a.stateMu.Lock()
	id = a.next
	a.next++
	a.stateMu.Unlock()
	if _, slot := logicpage.PageOf(a.next); slot != 0 && a.next < a.end {
		fresh = ^uint64(0) << slot
	}
	return id, fresh, nil
}

// freshOf returns the slots of page whose ids are not handed out yet (so hold no row
// anywhere): those of the current grant at or past next. The fresh mask take returns is
// only what was true then; the frame is created later (pin may wait for room, meanwhile
// another insert may take, commit and lose to eviction the next id of the page), so the
// cache intersects it with freshOf when it creates the frame. Any goroutine may call it; it
// never waits for more than stateMu.
func (a *idAllocator) freshOf(page uint64) uint64 {
	pageLo := page * logicpage.RowsPerPage
	a.stateMu.Lock()
	lo, hi := max(a.next, pageLo), min(a.end, pageLo+logicpage.RowsPerPage)
	a.stateMu.Unlock()
	if lo >= hi {
		return 0
	}
	mask := ^uint64(0) << (lo - pageLo)
	if n := hi - pageLo; n < logicpage.RowsPerPage {
		mask &= 1<<n - 1
	}
	return mask
}
