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

	mu         sync.Mutex
	next, end  uint64
	grantPages int
}

const idGrantPagesMax = 256

// take returns a new row id, asking the store for more pages when the grant is used up, and
// fresh: the slots of the id's page whose ids are not handed out yet, so hold no row anywhere.
// Slots handed out before may hold rows that reached the store and left the cache.
func (a *idAllocator) take(ctx context.Context, db *DB) (id, fresh uint64, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.next == a.end {
		a.grantPages = min(max(1, a.grantPages*2), idGrantPagesMax)
		first, count, err := db.store.AllocIDs(ctx, a.table.id, db.owner, a.table.epoch.Load(), a.grantPages)
		if err != nil {
			return 0, 0, err
		}
		if first < a.table.grantLo.Load() {
			a.table.grantLo.Store(first)
		}
		a.next, a.end = first, first+count
		if a.end > a.table.idHigh.Load() {
			a.table.idHigh.Store(a.end)
		}
		db.stats.idGrants.Add(1)
	}
	id = a.next
	a.next++
	if _, slot := logicpage.PageOf(a.next); slot != 0 && a.next < a.end {
		fresh = ^uint64(0) << slot
	}
	return id, fresh, nil
}
