package txnode

import (
	"context"
	"fmt"

	"github.com/weftdb/weft/logicpage"
)

// PinSet holds pages of a table in the cache until Release: the seed's transaction and
// group-transaction cache policies, beside CLOCK. A game pins the pages of a zone, a guild or
// a match for as long as it is active; transactions on them then never miss. The pinned pages
// count against CacheBytes.
type PinSet struct {
	db     *DB
	frames []*frameMeta
}

// Pin fetches the pages holding ids [lo, hi) of table and pins them. It fails with
// ErrCacheFull when they cannot all be held within the cache budget (after Options.CacheWait).
func (db *DB) Pin(ctx context.Context, table *Table, lo, hi uint64) (*PinSet, error) {
	if db.closed.Load() {
		return nil, ErrClosed
	}
	t := table.t
	if err := t.serving(); err != nil {
		return nil, err
	}
	ps := &PinSet{db: db}
	hi = min(hi, t.idHigh.Load()) // no rows beyond, and no page keys
	for page := lo / logicpage.RowsPerPage; page*logicpage.RowsPerPage < hi; page++ {
		_, m, err := db.cache.pin(ctx, pageKey(t.id, page), t.rowBytes, 0, 0)
		if err != nil {
			ps.Release()
			return nil, fmt.Errorf("txnode: pin %q [%d, %d): %w", t.name, lo, hi, err)
		}
		ps.frames = append(ps.frames, m)
		if err := db.fetch(ctx, t, m, page, ^uint64(0)); err != nil {
			ps.Release()
			return nil, err
		}
	}
	return ps, nil
}

// Pages returns how many pages the set holds.
func (ps *PinSet) Pages() int { return len(ps.frames) }

// Release unpins the pages. It is idempotent.
func (ps *PinSet) Release() {
	for _, m := range ps.frames {
		ps.db.cache.unpin(m)
	}
	ps.frames = nil
}
