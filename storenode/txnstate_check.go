package storenode

import (
	"errors"
	"fmt"
	"path"
	"strings"

	"github.com/weftdb/weft/internal/corrupt"
)

// checkTxnState is Check's look at a replica's transaction state sidecars (txnstate.go): the
// one the meta file m names must be there and decode whole for its index, its prepared parts
// fit the catalog (known tables of their row sizes, rows granted) and its move states name
// tables of the catalog, as Open needs; the others are noted (Open removes them).
func (c *checker) checkTxnState(names []string, m *metaState) error {
	for _, n := range names {
		if index, ok := parseTxnStateName(n); ok && index != m.txnState {
			c.note(Finding{File: n, Offset: -1, What: "a transaction state sidecar the meta file does not name: an older checkpoint's, or one not published (Open removes it)"})
		}
	}
	if m.txnState == 0 {
		return nil
	}
	name := txnStateName(m.txnState)
	entries, err := readTxnState(c.fs, c.dir, m.txnState)
	if errors.Is(err, corrupt.ErrCorruption) {
		what := strings.TrimPrefix(err.Error(), "storenode: "+path.Join(c.dir, name)+": ")
		c.damage(Finding{File: name, Offset: -1, What: strings.TrimPrefix(what, "storenode: ") +
			"; the prepared transactions, decisions and move states of the checkpoint are lost"})
		return nil
	}
	if err != nil {
		return fmt.Errorf("storenode: check %s: %w", c.dir, err)
	}
	tables := make(map[uint32]*metaTable, len(m.tables))
	for i := range m.tables {
		tables[m.tables[i].id] = &m.tables[i]
	}
	for i, ent := range entries {
		var bad string
		switch ent.kind {
		case kindTxnPrepare:
			var pr txnPrepareRecord
			_ = decodeTxnPrepareRecord(ent.payload, &pr) // decoded once already
			for k := range pr.commit.segments {
				s := &pr.commit.segments[k]
				t := tables[s.Table]
				switch {
				case t == nil || t.rowBytes != pr.commit.rowBytes[k] || s.Page >= tablePagesMax:
					bad = fmt.Sprintf("prepared transaction %v writes table %d (row size %d, page %d), which does not fit the catalog", pr.id, s.Table, pr.commit.rowBytes[k], s.Page)
				case segmentLastID(s.Page, s.Data, s.Clear) >= t.nextID:
					bad = fmt.Sprintf("prepared transaction %v writes a row of table %d never granted (next id %d)", pr.id, s.Table, t.nextID)
				}
			}
		case kindMoveState:
			id, _, _, _ := decodeMoveStateRecord(ent.payload)
			if tables[id] == nil {
				bad = fmt.Sprintf("move state of table %d, not in the catalog", id)
			}
		}
		if bad != "" {
			c.damage(Finding{File: name, Offset: -1, What: fmt.Sprintf("entry %d: %s: Open refuses the store", i, bad)})
		}
	}
	return nil
}
