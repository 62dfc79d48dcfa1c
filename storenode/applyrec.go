package storenode

import (
	"fmt"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/logicpage"
)

// The apply of every WAL record kind, in one place (docs/replication.md, 1.1 and 1.2).
// applyRecord decodes a record, checks it against the state (a record that does not fit is
// corruption) and applies its effect through the kind's apply function; replay is a call of
// it per record. The live paths check a request, append its record and call the same apply
// function with the values they hold (no decode of what they just encoded):
//
//	kind                      apply function          live callers
//	1, 7 create table         applyCreateTable        createTable (catalog.go)
//	2 drop table              applyDropTable          dropTable (catalog.go)
//	3 grant ids               applyGrantIDs           AllocIDs, MoveActivate, MoveWrite
//	4 grant owner             applyGrantOwnerLocked   AcquireFrom, registerGrant, MoveActivate,
//	                                                  finishRestore (backup_dir.go)
//	6 commit                  applyCommitBatch        commit (commit.go), MoveWrite
//	8 txn prepare             applyPrepare            prepareLocked (txn.go)
//	9 txn decide              applyDecide             decideLocked (txn_decide.go)
//	10 txn reported           noteReported            reportLocked (txn_decide.go)
//	11 txn apply              finishPart              applyTxn (txn_apply.go)
//	12 txn forgot             applyForgot             forgetReported (txn_forget.go)
//	16 move state             applyMoveState          setMoveState (move.go)
//	19 expired (replicas)     applyExpired            proposeExpiry (proposer.go)
//	20 txn expired (replicas) applyTxnExpired         proposeTxnExpiry (txn_repl.go); an
//	                                                  entry only: replay refuses the kind
//
// On a replica, ApplyCommitted's applyEntry (proposer.go) rechecks an entry on the applied
// state before the same apply functions (the 2PC kinds: txn_repl.go), and Open applies a
// replica checkpoint's sidecar with applyRecord (txnstate.go).
// Invariants and where live and replay still differ:
//   - applyRecord's checks never fail for a record the live engine wrote: the live path made
//     the same checks (and stronger ones) before it appended.
//   - the grants (3, 4) and the forgot record (12) are applied BEFORE their append on the
//     live path, as they always were: ids advanced before the wait are skipped if the
//     record fails (never handed out twice); a new holder is installed in the same leaseMu
//     hold as the old lease's check (a renewal in between would be told a lease is live)
//     and put back if the append fails; parts are forgotten in memory even if the append
//     fails. The effect is the shared function all the same.
//   - what is soft state, not the record's effect, stays with its path: a live grant's
//     lease, incarnation and grant LSN; a replayed grant's lease from Open (as loadTable's);
//     a table's creator (MaxTablesPerOwner counts since Open only); the commit path's frame
//     reservation and stall, which happen before the append (rows reach the cache under the
//     record's LSN, commit.go).
//   - replay tolerates records a checkpoint already covers or carried (carryTxns,
//     carryPrepared, carryMoves): the carried records are re-logs of state the live engine
//     holds, so the live carry applies nothing.
//   - the recount of a decision kept with no owner when its part's prepare comes is in
//     applyRecord's prepare case only: it is for a decision a checkpoint carried before its
//     part; the live order never needs it (a commit is recorded only for a part prepared
//     here, an abort refuses the prepare: txn_guard.go, prepareLocked).
//   - two changes of kept decisions have no record, so replay cannot make them: a count an
//     abort learns (learnCount, txn_forget.go: a checkpoint carries it, a kill forgets it)
//     and the sweep's forgetting of an abort every participant reported (replay queues it
//     again; the next sweep forgets it). TestReplayEqualsLive leaves out the first and
//     sweeps before it compares.

// applyRecord applies one record at lsn: replay's step (replayRecord), under mu. It does not
// set lastLSN.
func (e *Engine) applyRecord(kind byte, payload []byte, lsn uint64) error {
	switch kind {
	case kindCreateTable, kindCreateClusterTable:
		var (
			id       uint32
			rowBytes int
			name     string
			cl       base.ClusterLayout
			err      error
		)
		if kind == kindCreateTable {
			id, rowBytes, name, err = decodeCreateRecord(payload)
		} else {
			id, rowBytes, name, cl, err = decodeCreateClusterRecord(payload)
		}
		if err != nil {
			return err
		}
		if id == 0 || id == tableIDNone {
			return corrupt.Errorf("storenode: replay: record %d creates table %d, an id never granted", lsn, id)
		}
		if _, ok := e.tables[id]; ok || id < e.nextTable && e.tablesByIDAll(id) != nil {
			return corrupt.Errorf("storenode: replay: table %d created twice", id)
		}
		geo, _ := logicpage.NewGeometry(rowBytes)
		f, err := e.fs.Create(dataFileName(e.dir, id))
		if err != nil {
			return fmt.Errorf("storenode: create table %q: %w", name, err)
		}
		e.applyCreateTable(id, name, geo, cl, f)
	case kindDropTable:
		id, err := decodeDropRecord(payload)
		if err != nil {
			return err
		}
		t, ok := e.tables[id]
		if !ok {
			return corrupt.Errorf("storenode: replay: drop of unknown table %d", id)
		}
		e.applyDropTable(t, lsn)
	case kindGrantIDs:
		id, next, err := decodeGrantIDsRecord(payload)
		if err != nil {
			return err
		}
		t, ok := e.tables[id]
		if !ok {
			return corrupt.Errorf("storenode: replay: id grant for unknown table %d", id)
		}
		e.applyGrantIDs(t, next)
	case kindGrantOwner:
		id, owner, epoch, err := decodeGrantOwnerRecord(payload)
		if err != nil {
			return err
		}
		t, ok := e.tables[id]
		if !ok {
			return corrupt.Errorf("storenode: replay: ownership grant for unknown table %d", id)
		}
		e.leaseMu.Lock()
		e.applyGrantOwnerLocked(t, owner, epoch)
		if !e.opts.ExpireLeasesAtOpen && !t.cluster.IsCluster() {
			// Soft state: a replayed holder's lease starts at Open, as a checkpointed one's
			// (loadTable).
			t.leaseUntil, t.leaseAtOpen = e.opts.Now().Add(e.opts.LeaseDuration), true
		}
		e.leaseMu.Unlock()
	case kindCommit:
		return e.applyCommitRecord(payload, lsn)
	case kindCommitV1:
		return oldCommitRecordError(lsn)
	case kindTxnPrepare, kindTxnDecide, kindTxnReported, kindTxnApply, kindTxnForgot:
		return e.applyTxnRecord(kind, lsn, payload)
	case kindMoveState:
		id, s, epoch, err := decodeMoveStateRecord(payload)
		if err != nil {
			return err
		}
		if _, ok := e.tables[id]; !ok {
			return corrupt.Errorf("storenode: replay: record %d: move state of unknown table %d", lsn, id)
		}
		e.applyMoveState(id, s, epoch)
	case kindExpired:
		if err := e.applyExpired(payload); err != nil {
			return fmt.Errorf("storenode: replay: record %d: %w", lsn, err)
		}
	default:
		return corrupt.Errorf("storenode: replay: record %d of unknown kind %d", lsn, kind)
	}
	return nil
}

// applyCreateTable registers table id with its data file f, open (the live path creates it
// before the record, so a file that cannot be made logs nothing), and raises the next table
// id past it. Caller holds mu.
func (e *Engine) applyCreateTable(id uint32, name string, geo logicpage.Geometry, cl base.ClusterLayout, f vfs.File) *table {
	t := e.registerTable(id, name, geo, f, cl)
	e.nextTable = max(e.nextTable, id+1)
	return t
}

// applyDropTable drops t by the record at lsn: its file goes once a checkpoint after lsn no
// longer lists it. Caller holds mu.
func (e *Engine) applyDropTable(t *table, lsn uint64) {
	e.removeTable(t)
	t.dropLSN = lsn
}

// applyGrantIDs raises t's id high-water mark to next (never lowers it: a replayed grant a
// checkpoint covers). Caller holds mu.
func (e *Engine) applyGrantIDs(t *table, next uint64) {
	t.nextID = max(t.nextID, next)
}

// applyGrantOwnerLocked makes owner t's holder at epoch (owner 0: nobody, a move's floor).
// Caller holds mu and leaseMu (renewals read holders under leaseMu alone).
func (e *Engine) applyGrantOwnerLocked(t *table, owner, epoch uint64) {
	t.holder, t.epoch = owner, epoch
}

// applyCommitBatch applies b, its frames reserved and pinned, at lsn: rows into the cache
// and the bitmap-trees, frames unpinned, the owner's seq and dedup entry (hash) advanced
// unless the seq is not above the owner's last (only in replay: a record replayed again
// after a checkpoint that covered it; the live path checked the seq). Caller holds mu. It
// allocates nothing once the owner's window exists (the commit path's AllocsPerRun tests).
func (e *Engine) applyCommitBatch(b *base.Batch, hash, lsn uint64) {
	e.applyBatch(b, lsn)
	e.unpinFrames(b, len(b.Segments))
	if e.replaying {
		if o := e.owners[b.Owner]; o != nil && b.Seq <= o.lastSeq {
			return
		}
	}
	e.applied(b.Owner, b.Seq, lsn, hash)
}

// applyCommitRecord applies a commit record into the cache. Caller holds mu. It reserves a
// frame for every page of the record before it applies any: when the cache has no room, it
// checkpoints first, with the record not applied at all, so a checkpoint never holds part of
// a record while its LSN is before it (a checkpoint LSN is never inside a record).
func (e *Engine) applyCommitRecord(payload []byte, lsn uint64) error {
	var c commitRecord
	if err := decodeCommitRecord(payload, &c); err != nil {
		return fmt.Errorf("storenode: replay: record %d: %w", lsn, err)
	}
	if c.owner == 0 || c.seq == 0 {
		// Commit refuses both; the dedup table of a checkpoint could not hold them.
		return corrupt.Errorf("storenode: replay: record %d: commit of owner %d seq %d", lsn, c.owner, c.seq)
	}
	if err := e.replayFits(lsn, &c); err != nil {
		return err
	}
	b := &base.Batch{Owner: c.owner, Seq: c.seq, Segments: c.segments}
	for {
		room, err := e.reserveFrames(b)
		if err != nil {
			return fmt.Errorf("storenode: replay: record %d: %w", lsn, err)
		}
		if room {
			break
		}
		if e.txnLive() || e.movesLive() {
			// A checkpoint now would publish a checkpoint LSN past the records of the live
			// transactions, which only a running engine's checkpoints carry (txn.go).
			e.replayForce = true
			continue
		}
		// Full of dirty pages: write them out before this record.
		e.mu.Unlock()
		err = e.checkpoint(true)
		e.mu.Lock()
		if err != nil {
			return err
		}
	}
	e.applyCommitBatch(b, c.hash, lsn)
	return nil
}

// replayFits checks a replayed batch's segments against the catalog: known tables of the
// record's row sizes, pages within a table, rows granted.
func (e *Engine) replayFits(lsn uint64, c *commitRecord) error {
	for i := range c.segments {
		s := &c.segments[i]
		t, ok := e.tables[s.Table]
		if !ok || t.geo.RowBytes() != c.rowBytes[i] || s.Page >= tablePagesMax {
			return corrupt.Errorf("storenode: replay: record %d: segment of table %d (row size %d, page %d) does not fit the catalog",
				lsn, s.Table, c.rowBytes[i], s.Page)
		}
		if last := segmentLastID(s.Page, s.Data, s.Clear); last >= t.nextID {
			return corrupt.Errorf("storenode: replay: record %d: row %d of table %d was never granted (next id %d)", lsn, last, s.Table, t.nextID)
		}
	}
	return nil
}

// applyTxnRecord applies one two-phase commit record at lsn (kinds 8 to 12). Caller holds mu.
// Replay accepts every sequence of records the engine writes (txn.go): a record may repeat
// one a checkpoint carried, or follow what the live engine forgot in memory only.
func (e *Engine) applyTxnRecord(kind byte, lsn uint64, payload []byte) error {
	switch kind {
	case kindTxnPrepare:
		var pr txnPrepareRecord
		if err := decodeTxnPrepareRecord(payload, &pr); err != nil {
			return fmt.Errorf("storenode: replay: record %d: %w", lsn, err)
		}
		c := &pr.commit
		if c.owner == 0 || c.seq == 0 {
			return corrupt.Errorf("storenode: replay: record %d: prepare of owner %d seq %d", lsn, c.owner, c.seq)
		}
		if err := e.replayFits(lsn, c); err != nil {
			return err
		}
		if old := e.txnParts[pr.id]; old != nil {
			if old.decision == base.DecisionNone {
				return nil // carried again by a checkpoint that did not publish
			}
			// Applied, reported and forgotten by the live engine (in memory only before the
			// forgot record), then prepared again: the new part replaces it.
			delete(e.txnParts, pr.id)
		}
		rec := append([]byte(nil), payload...) // the WAL's buffer is not ours
		if err := decodeTxnPrepareRecord(rec, &pr); err != nil {
			return err
		}
		p := &txnPart{id: pr.id, lease: pr.lease, primary: pr.primary, index: pr.index, hash: c.hash, lsn: lsn, at: e.opts.Now(), rec: rec,
			batch: base.Batch{Owner: c.owner, Seq: c.seq, Fences: pr.commit.fences, Segments: pr.commit.segments}}
		e.applyPrepare(p)
		if d := e.txnDecisions[pr.id]; d != nil && d.owner == 0 && p.primary == "" {
			e.countDecision(d, c.owner) // the decision was carried before its part
		}
	case kindTxnApply:
		id, d, index, primary, err := decodeTxnApplyRecord(payload)
		if err != nil {
			return fmt.Errorf("storenode: replay: record %d: %w", lsn, err)
		}
		p := e.txnParts[id]
		switch {
		case p == nil:
			// An applied part a checkpoint carried (its prepare is before the checkpoint).
			e.txnParts[id] = &txnPart{id: id, primary: primary, index: index, decision: d, lsn: lsn, at: e.opts.Now()}
		case p.decision == base.DecisionNone:
			if d == base.DecisionCommit {
				for {
					room, err := e.reserveFrames(&p.batch)
					if err != nil {
						return fmt.Errorf("storenode: replay: record %d: %w", lsn, err)
					}
					if room {
						break
					}
					e.replayForce = true // no checkpoint in replay while a txn is live
				}
			}
			e.finishPart(p, d, lsn)
		case p.decision != d:
			return corrupt.Errorf("storenode: replay: record %d: transaction %v applied %v, then %v", lsn, id, p.decision, d)
		}
	case kindTxnDecide:
		id, d, count, lease, reported, err := decodeTxnDecideRecord(payload)
		if err != nil {
			return fmt.Errorf("storenode: replay: record %d: %w", lsn, err)
		}
		e.applyDecide(id, d, count, lease, reported, lsn)
	case kindTxnReported:
		id, index, err := decodeTxnReportedRecord(payload)
		if err != nil {
			return fmt.Errorf("storenode: replay: record %d: %w", lsn, err)
		}
		if rec := e.txnDecisions[id]; rec != nil {
			e.noteReported(id, rec, index)
		}
	case kindTxnForgot:
		if err := decodeTxnForgotRecord(payload, e.applyForgot); err != nil {
			return fmt.Errorf("storenode: replay: record %d: %w", lsn, err)
		}
	}
	return nil
}

// applyPrepare installs the prepared part p (its lsn, hash and batch set) with its row locks,
// and advances its owner's seq as a commit does (applyCommitBatch: not in replay for a seq
// not above the owner's last). Caller holds mu.
func (e *Engine) applyPrepare(p *txnPart) {
	e.installPart(p)
	b := &p.batch
	if e.replaying {
		if o := e.owners[b.Owner]; o != nil && b.Seq <= o.lastSeq {
			return
		}
	}
	e.applied(b.Owner, b.Seq, p.lsn, p.hash)
}

// applyDecide records decision d of id by the decide record at lsn and returns the kept
// decision. A new decision is counted for its owner (decisionOwner) and queued for the
// abort sweep. A record of a decision already kept merges into it (count, reports: a
// checkpoint's carry, or a count learned); of another decision (the live engine forgot the
// old one in memory only, then decided afresh) it replaces it. A decision every
// participant reported is forgotten (as the live engine forgot it, or carried it as
// forgotten: carryTxns). Caller holds mu.
func (e *Engine) applyDecide(id base.TxnID, d base.Decision, count uint16, lease int64, reported, lsn uint64) *txnDecision {
	rec := e.txnDecisions[id]
	if rec != nil && rec.d != d {
		delete(e.txnDecisions, id)
		e.countDecision(rec, 0)
		rec = nil
	}
	if rec == nil {
		rec = e.keepDecision(id, d, count, lease, 0, lsn)
	}
	rec.count = max(rec.count, count)
	rec.reported |= reported
	if rec.count > 0 {
		rec.reported &= decisionMask(rec.count)
	}
	if rec.allReported() {
		// A commit every participant reported, or a decision forgotten and carried by a
		// checkpoint (carryTxns); an abort all reported is forgotten as the sweep would.
		e.forgetDecision(id, rec)
	}
	return rec
}

// keepDecision keeps a new decision of id (none kept) with its reports, counted for its owner
// (decisionOwner) and queued for the abort sweep (an abort every participant reported: for
// its next pass). Caller holds mu.
func (e *Engine) keepDecision(id base.TxnID, d base.Decision, count uint16, lease int64, reported, lsn uint64) *txnDecision {
	rec := &txnDecision{d: d, count: count, lease: lease, reported: reported, lsn: lsn, at: e.opts.Now()}
	if count > 0 {
		rec.reported &= decisionMask(count)
	}
	e.countDecision(rec, e.decisionOwner(id))
	e.txnDecisions[id] = rec
	e.queueAbort(id, rec)
	return rec
}

// applyForgot drops a part a forgot record names: applied, reported, forgotten (a part
// prepared again since is not). Caller holds mu.
func (e *Engine) applyForgot(id base.TxnID) {
	if p := e.txnParts[id]; p != nil && p.decision != base.DecisionNone {
		delete(e.txnParts, id)
	}
}
