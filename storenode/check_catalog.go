package storenode

import (
	"fmt"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/storenode/wal"
)

// Check of the catalog (see check.go): the tables of the meta file, then the WAL's records
// after the checkpoint replayed as recovery replays them (replayRecord), at the catalog level
// only (no rows are kept), with the engine's record decoders.

// tableIDNone is the one table id never granted (with it the next table id would wrap, and the
// meta file requires every id below it); 0 is never granted either.
const tableIDNone = ^uint32(0)

// checkTableState is a table as the catalog replay sees it.
type checkTableState struct {
	name     string
	rowBytes int
	nextID   uint64
	epoch    uint64
	live     bool // false once dropped
	cluster  bool // cluster-managed: a restored copy raises its floor to etcd's revision, no bump
}

// checkCatalog is the catalog as of the record being replayed.
type checkCatalog struct {
	tables    map[uint32]*checkTableState // every table seen, dropped ones too
	byName    map[string]uint32           // live tables
	nextTable uint32
}

func (k *checkCatalog) init(m *metaState) {
	k.tables = make(map[uint32]*checkTableState, len(m.tables))
	k.byName = make(map[string]uint32, len(m.tables))
	k.nextTable = m.nextTable
	for _, t := range m.tables {
		k.tables[t.id] = &checkTableState{name: t.name, rowBytes: t.rowBytes, nextID: t.nextID, epoch: t.epoch, live: true,
			cluster: t.cluster.IsCluster()}
		k.byName[t.name] = t.id
	}
}

// record replays one WAL record at file, off into the catalog, reporting what recovery would
// refuse (a record that does not decode, a table unknown or created twice, a segment that
// does not fit its table), rows written at or above their table's granted ids and an
// ownership epoch not above the table's (epochs are never granted twice).
func (k *checkCatalog) record(c *checker, rec wal.Record, file string, off int64) {
	bad := func(table uint32, format string, args ...any) {
		c.damage(Finding{File: file, Offset: off, LSN: rec.LSN, Table: table, Page: -1, DiskPage: -1,
			What: fmt.Sprintf(format, args...)})
	}
	live := func(id uint32, what string) *checkTableState {
		t := k.tables[id]
		if t == nil || !t.live {
			bad(id, "%s of table %d, which does not exist at this LSN", what, id)
			return nil
		}
		return t
	}
	switch rec.Kind {
	case kindCreateTable, kindCreateClusterTable:
		var (
			id       uint32
			rowBytes int
			name     string
			cl       base.ClusterLayout
			err      error
		)
		if rec.Kind == kindCreateTable {
			id, rowBytes, name, err = decodeCreateRecord(rec.Payload)
		} else {
			id, rowBytes, name, cl, err = decodeCreateClusterRecord(rec.Payload)
		}
		if err != nil {
			bad(0, "create-table record: %v", err)
			return
		}
		if id == 0 || id == tableIDNone {
			bad(id, "table %d %q: an id never granted (ids run from 1 to %d): no checkpoint could publish it", id, name, tableIDNone-1)
			return
		}
		if k.tables[id] != nil {
			bad(id, "table %d %q created twice", id, name)
			return
		}
		if other, ok := k.byName[name]; ok {
			bad(id, "table %d created as %q, the name of live table %d", id, name, other)
		}
		k.tables[id] = &checkTableState{name: name, rowBytes: rowBytes, live: true, cluster: cl.IsCluster()}
		k.byName[name] = id
		k.nextTable = max(k.nextTable, id+1)
	case kindDropTable:
		id, err := decodeDropRecord(rec.Payload)
		if err != nil {
			bad(0, "drop-table record: %v", err)
			return
		}
		if t := live(id, "drop"); t != nil {
			t.live = false
			delete(k.byName, t.name)
		}
	case kindGrantIDs:
		id, next, err := decodeGrantIDsRecord(rec.Payload)
		if err != nil {
			bad(0, "id-grant record: %v", err)
			return
		}
		if t := live(id, "id grant"); t != nil {
			if next > MaxRowID {
				bad(id, "id grant up to %d, beyond the last row id %d", next, uint64(MaxRowID-1))
			}
			t.nextID = max(t.nextID, next)
		}
	case kindGrantOwner:
		id, _, epoch, err := decodeGrantOwnerRecord(rec.Payload)
		if err != nil {
			bad(0, "ownership record: %v", err)
			return
		}
		if t := live(id, "ownership grant"); t != nil {
			if epoch <= t.epoch {
				bad(id, "ownership grant of epoch %d, not above the table's epoch %d: an epoch granted twice", epoch, t.epoch)
			}
			t.epoch = max(t.epoch, epoch)
		}
	case kindTxnDecide, kindTxnReported, kindTxnApply, kindTxnForgot:
		var err error
		switch rec.Kind {
		case kindTxnForgot:
			err = decodeTxnForgotRecord(rec.Payload, func(base.TxnID) {})
		case kindTxnDecide:
			_, _, _, _, _, err = decodeTxnDecideRecord(rec.Payload)
		case kindTxnReported:
			_, _, err = decodeTxnReportedRecord(rec.Payload)
		default:
			_, _, _, _, err = decodeTxnApplyRecord(rec.Payload)
		}
		if err != nil {
			bad(0, "transaction record: %v", err)
		}
	case kindCommit, kindTxnPrepare:
		var cr commitRecord
		if rec.Kind == kindTxnPrepare {
			var pr txnPrepareRecord
			if err := decodeTxnPrepareRecord(rec.Payload, &pr); err != nil {
				bad(0, "prepare record: %v", err)
				return
			}
			cr = pr.commit
		} else if err := decodeCommitRecord(rec.Payload, &cr); err != nil {
			bad(0, "commit record: %v", err)
			return
		}
		if cr.owner == 0 || cr.seq == 0 {
			bad(0, "commit of owner %d seq %d: the engine refuses owner 0 and seq 0, and no checkpoint could publish them", cr.owner, cr.seq)
		}
		for i := range cr.segments {
			s := &cr.segments[i]
			t := live(s.Table, "commit segment")
			if t == nil {
				continue
			}
			if t.rowBytes != cr.rowBytes[i] || s.Page >= tablePagesMax {
				bad(s.Table, "commit segment %d (row size %d, page %d) does not fit the table (row size %d, pages below %d)",
					i, cr.rowBytes[i], s.Page, t.rowBytes, uint64(tablePagesMax))
				continue
			}
			// Replay's rule (segmentLastID): a clear mask names rows too, and an empty
			// segment names its page's first id.
			if top := segmentLastID(s.Page, s.Data, s.Clear); top >= t.nextID {
				bad(s.Table, "commit segment %d names row %d (page %d, data mask %#016x, clear mask %#016x), at or above the table's granted ids (next id %d)",
					i, top, s.Page, s.Data, s.Clear, t.nextID)
			}
		}
	case kindMoveState:
		if id, _, _, err := decodeMoveStateRecord(rec.Payload); err != nil {
			bad(0, "move state record: %v", err)
		} else {
			live(id, "move state")
		}
	case kindExpired:
		if err := decodeExpiredRecord(rec.Payload, func(expiredOwner) {}); err != nil {
			bad(0, "expiry record: %v", err)
		}
	default:
		bad(0, "record of unknown kind %d", rec.Kind)
	}
}
