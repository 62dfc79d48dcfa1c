package storenode

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/assert"
	"github.com/weftdb/weft/internal/corrupt"
)

// The storage node's side of two-phase commit (docs/cluster.md, "Two-phase commit").
//
// A participant keeps, per transaction it prepared, a txnPart: the prepared batch (an owned
// copy of its prepare record, rows aliasing it) and the primary to ask, until the decision is
// applied and reported to the primary. The primary keeps, per decided transaction, a
// txnDecision: the decision, the participant count and which participants reported, until
// every participant reported (commit), or until every one did or it is older than
// Options.TxnAbortKeep (abort).
//
// Invariants, under mu:
//   - txnLocks[frameKey(table, page)] is the OR of the data and clear masks of every prepared
//     (not applied) part's segments on that page; a commit or prepare that touches a locked
//     slot is refused with ErrTxnLocked, so the prepared rows cannot change under the
//     transaction and are applied exactly as prepared.
//   - prepared rows are never in the page cache: readers see the last committed version.
//   - a part or decision is installed when its record is handed to the WAL; nothing is
//     answered about it (to the coordinator, a resolver or a peer) before that record is
//     durable (waitDurable): a decision another node acts on can never be lost by a crash.
//   - every txn record but the forgot record is forced (synced) in every sync mode: a
//     prepare is a promise, a decision the commit point, an apply the condition of reporting
//     it; a forgot record lost only makes its parts report again.
//   - replay accepts every sequence of records the engine writes: where the live engine
//     forgot something in memory only, the later record replaces it (txn_forget.go).
//   - a checkpoint re-logs (carries) every live part and decision after its checkpoint LSN
//     (carryTxns; the prepared parts in chunks after its snapshot's hold, carryPrepared in
//     txn_quota.go), so the records recovery needs are never before the checkpoint, and no
//     checkpoint runs during replay while any is live (the cache may then pass its budget,
//     by at most the dirty pages of the WAL being replayed).
//   - the prepared parts (txnPrepared) and len(txnDecisions) are each at most
//     Options.MaxTxns (applied parts waiting to report are bounded at a prepare,
//     txnPartsRoom); no loop under mu visits more than O(1) entries amortized; the forgotten
//     decisions remembered (txnForgot: a resent Decide is answered with them) at most
//     Options.TxnForgetMax, the newest MaxTxns of them carried by each checkpoint too.

// LeaseChecker tells whether a coordinator's lease (an etcd lease id) is alive. Package
// cluster implements it with Client.LeaseAlive; storenode does not import cluster. It is
// called without any engine lock held, on the goroutine of the request or of the resolver,
// with a bounded context.
type LeaseChecker interface {
	LeaseAlive(ctx context.Context, lease int64) (bool, error)
}

// TxnPeer is how a participant reaches the primary of a transaction: ask for the decision,
// report the decision applied. storenode/server implements it over sgio (NewTxnPeer); tests
// link engines in memory. Called without any engine lock held.
type TxnPeer interface {
	AskTxn(ctx context.Context, primary string, id base.TxnID, lease int64) (base.Decision, error)
	ReportTxn(ctx context.Context, primary string, id base.TxnID, index uint16) error
}

// txnPart is a participant's transaction. Guarded by mu.
type txnPart struct {
	id       base.TxnID
	lease    int64
	primary  string
	index    uint16
	hash     uint64 // the prepare's dedup hash
	lsn      uint64 // of the prepare (or apply) record
	at       time.Time
	rec      []byte     // owned prepare payload; nil once applied
	batch    base.Batch // the prepared batch, aliasing rec
	decision base.Decision
}

// txnDecision is a primary's record of a decided transaction. Guarded by mu.
type txnDecision struct {
	d        base.Decision
	count    uint16
	lease    int64
	reported uint64
	lsn      uint64 // of the decide record: answer only once durable
	at       time.Time
	// owner is the owner of the primary's prepared part the decision was recorded for,
	// counted in txnDecisionOwners (txn_decisions.go); 0: unknown, not counted.
	owner uint64
}

// allReported reports whether participants 0..count-1 all reported; never with count 0
// (participants unknown). Reports beyond the count do not count (decisionMask).
func (d *txnDecision) allReported() bool {
	m := decisionMask(d.count)
	return d.count > 0 && d.reported&m == m
}

// txnBatchHash is the dedup hash of a prepared batch: its batch hash mixed with the id.
func txnBatchHash(b *base.Batch, id base.TxnID) uint64 {
	var buf [24]byte
	binary.LittleEndian.PutUint64(buf[:], batchHash(b))
	copy(buf[8:], id[:])
	return xxhash.Sum64(buf[:])
}

// PrepareTxn makes p's batch durable as prepared: checked as a commit (fences, then the seq
// window: a retry of the same prepare gets its LSN again), refused with ErrTxnLocked when it
// touches a row another prepared transaction holds, and with ErrTxnDecided when this node
// already applied the transaction or, as its primary, recorded abort. It returns the prepare
// record's LSN once synced. The rows are not applied: readers keep seeing the committed
// version until ApplyTxn(commit). PrepareTxn does not retain p or the batch's memory.
func (e *Engine) PrepareTxn(p *base.TxnPrepare) (uint64, error) {
	b := p.Batch
	if b == nil || b.Owner == 0 || b.Owner == MoveWriter || b.Seq == 0 {
		return 0, fmt.Errorf("%w: prepare without a batch, owner or seq (or of the reserved owner id)", ErrMalformed)
	}
	if p.Index >= txnParticipantsMax || len(p.Primary) > txnPrimaryBytesMax {
		return 0, fmt.Errorf("%w: prepare of participant %d, primary of %d bytes", ErrMalformed, p.Index, len(p.Primary))
	}
	if len(b.Segments) > txnSegmentsMax {
		// Applying it must reserve a frame for every page at once (reserveFrames): a larger
		// batch could be prepared but never applied.
		return 0, fmt.Errorf("%w: prepare of %d segments, at most %d", ErrBatchTooLarge, len(b.Segments), txnSegmentsMax)
	}
	hash := txnBatchHash(b, p.Txn)
	e.mu.Lock()
	lsn, err := e.prepareLocked(p, hash)
	e.mu.Unlock()
	if err != nil {
		return 0, err
	}
	if err := e.waitDurable(lsn); err != nil {
		return 0, err
	}
	return lsn, nil
}

func (e *Engine) prepareLocked(p *base.TxnPrepare, hash uint64) (uint64, error) {
	b := p.Batch
	var gapDeadline time.Time
	for {
		if e.closed {
			return 0, ErrClosed
		}
		o := e.owners[b.Owner]
		if o != nil && b.Seq <= o.lastSeq {
			lsn, err := o.retried(b, hash)
			if err != nil {
				return 0, err
			}
			e.stats.retried.Add(1)
			return lsn, nil
		}
		if err := e.failure(); err != nil {
			return 0, err
		}
		if err := e.checkBatch(b); err != nil {
			e.noteRefused(b.Owner, o, b.Seq)
			return 0, err
		}
		if o == nil {
			if err := e.freshRefusedGap(b.Owner, b.Seq); err != nil {
				return 0, err
			}
		}
		if o != nil && b.Seq > o.lastSeq+1 {
			if err := o.refusedGap(b.Seq); err != nil {
				return 0, err
			}
			if gapDeadline.IsZero() {
				gapDeadline = time.Now().Add(e.opts.SeqGapWait)
				timer := time.AfterFunc(e.opts.SeqGapWait, e.wake)
				defer timer.Stop()
			}
			if !time.Now().Before(gapDeadline) {
				return 0, fmt.Errorf("%w: batch seq %d, last applied %d", ErrSeqGap, b.Seq, o.lastSeq)
			}
			e.cond.Wait()
			continue
		}
		break
	}
	if old := e.txnParts[p.Txn]; old != nil {
		if old.decision != base.DecisionNone {
			return 0, fmt.Errorf("%w: transaction %v: this participant applied %v", ErrTxnDecided, p.Txn, old.decision)
		}
		return 0, fmt.Errorf("%w: transaction %v is prepared here under another seq", ErrMalformed, p.Txn)
	}
	if d := e.txnDecisions[p.Txn]; d != nil && p.Primary == "" && d.d == base.DecisionAbort {
		return 0, fmt.Errorf("%w: transaction %v: the primary recorded abort", ErrTxnDecided, p.Txn)
	}
	if p.Primary == "" && len(e.txnForgot) > 0 {
		if f, ok := e.forgottenLocked(p.Txn); ok {
			return 0, fmt.Errorf("%w: transaction %v: the primary decided %v (and forgot it)", ErrTxnDecided, p.Txn, f.d)
		}
	}
	if at, ok := e.txnAborted[p.Txn]; ok {
		if e.opts.Now().Sub(at) < e.opts.TxnAbortKeep {
			return 0, fmt.Errorf("%w: transaction %v: abort was applied here before this prepare came", ErrTxnDecided, p.Txn)
		}
		delete(e.txnAborted, p.Txn)
	}
	if err := e.checkTxnLocks(b.Segments); err != nil {
		return 0, err
	}
	if err := e.txnPartsRoom(); err != nil {
		return 0, err
	}
	size := txnPrepareFixed + padTo8(len(p.Primary)) + commitHashBytes + commitBodyFixedBytes + commitFenceBytes*len(b.Fences)
	for i := range b.Segments {
		size += commitSegmentHeaderBytes + len(b.Segments[i].Rows)
	}
	if e.txnBytes+int64(size) > e.opts.MaxTxnBytes {
		return 0, fmt.Errorf("%w: %d bytes of prepared batches held, %d more would pass the limit %d", ErrTxnBusy, e.txnBytes, size, e.opts.MaxTxnBytes)
	}
	if err := e.checkOwnerQuota(b.Owner, size); err != nil {
		return 0, err
	}
	// The record, owned: the part keeps it (the batch's rows alias it) until applied.
	rec := make([]byte, 0, size)
	rec = appendTxnPrepareHeader(rec, p.Txn, p.Lease, p.Index, p.Primary)
	rec = appendCommitRecord(rec, b, hash, func(t uint32) int { return e.tables[t].geo.RowBytes() })
	assert.That(len(rec) == size, "storenode: prepare record size")
	part := &txnPart{id: p.Txn, lease: p.Lease, primary: p.Primary, index: p.Index, hash: hash, at: e.opts.Now(), rec: rec}
	var pr txnPrepareRecord
	if err := decodeTxnPrepareRecord(rec, &pr); err != nil {
		return 0, fmt.Errorf("storenode: prepare: own record: %w", err)
	}
	part.batch = base.Batch{Owner: b.Owner, Seq: b.Seq, Fences: pr.commit.fences, Segments: pr.commit.segments}
	lsn, err := e.appendRecord(kindTxnPrepare, rec, true, noAck)
	if err != nil {
		return 0, err
	}
	part.lsn = lsn
	e.installPart(part)
	e.applied(b.Owner, b.Seq, lsn, hash)
	e.cond.Broadcast()
	return lsn, nil
}

func noAck(uint64, error) {}

// installPart adds a prepared part and its row locks. Caller holds mu.
func (e *Engine) installPart(p *txnPart) {
	e.txnParts[p.id] = p
	e.txnPrepared++
	e.txnBytes += int64(len(p.rec))
	e.ownerQuotaAdd(p.batch.Owner, 1, len(p.rec))
	e.startResolver()
	for i := range p.batch.Segments {
		s := &p.batch.Segments[i]
		e.txnLocks[frameKey(s.Table, s.Page)] |= s.Data | s.Clear
		e.txnTables[s.Table]++
	}
}

// unlockPart removes a part's row locks. Caller holds mu.
func (e *Engine) unlockPart(p *txnPart) {
	for i := range p.batch.Segments {
		s := &p.batch.Segments[i]
		k := frameKey(s.Table, s.Page)
		if m := e.txnLocks[k] &^ (s.Data | s.Clear); m != 0 {
			e.txnLocks[k] = m
		} else {
			delete(e.txnLocks, k)
		}
		if e.txnTables[s.Table]--; e.txnTables[s.Table] <= 0 {
			delete(e.txnTables, s.Table)
		}
	}
}

// checkTxnLocks refuses segments that touch a row of a prepared transaction. Caller holds
// mu. Without prepared transactions it costs one map length.
func (e *Engine) checkTxnLocks(segs []base.Segment) error {
	if len(e.txnLocks) == 0 {
		return nil
	}
	for i := range segs {
		s := &segs[i]
		if m := e.txnLocks[frameKey(s.Table, s.Page)] & (s.Data | s.Clear); m != 0 {
			return fmt.Errorf("%w: table %d page %d rows %#016x", ErrTxnLocked, s.Table, s.Page, m)
		}
	}
	return nil
}

// tableLocked reports whether a prepared transaction writes table id: O(1), a count kept
// by installPart and unlockPart (an Acquire of another owner's table asks it under mu).
// Caller holds mu.
func (e *Engine) tableLocked(id uint32) bool {
	e.txnVisited++ // one entry read (tests)
	return e.txnTables[id] > 0
}

// DecideTxn records the decision d of transaction id at this node, its primary: a
// compare-and-set. The first decision is logged (synced) and kept; the same decision again
// returns it; a different one fails with ErrTxnDecided naming the recorded one. count is the
// number of participants (1..64 for commit; 0..64 for abort, 0 when unknown), numbered as
// their TxnPrepare.Index: the record is kept until each reported (ReportTxn). A commit is
// refused, and abort recorded instead (ErrTxnDecided, "abort"), when the LeaseChecker says
// lease is gone: a coordinator whose lease expired may have been resolved against already.
// A decision already recorded is answered without the lease check (a resent Decide learns
// the outcome while etcd is unreachable). ctx bounds the lease check; the wait for the
// record's sync is bounded by the disk. A decision is recorded only for a transaction whose
// prepared part this node holds as its primary (decideGuard, txn_guard.go): an abort of an id
// it holds no part of is answered without a record, a commit refused with ErrTxnNotPrepared.
// DecideTxn does not check which owner prepared the part (an embedded engine's caller is
// trusted); DecideTxnAs does.
func (e *Engine) DecideTxn(ctx context.Context, id base.TxnID, lease int64, d base.Decision, count int) (base.Decision, error) {
	return e.decideTxn(ctx, decider{any: true}, id, lease, d, count)
}

func (e *Engine) decideTxn(ctx context.Context, owner decider, id base.TxnID, lease int64, d base.Decision, count int) (base.Decision, error) {
	switch {
	case d != base.DecisionCommit && d != base.DecisionAbort:
		return base.DecisionNone, fmt.Errorf("%w: decision %d", ErrMalformed, d)
	case count < 0 || count > txnParticipantsMax || d == base.DecisionCommit && count == 0:
		return base.DecisionNone, fmt.Errorf("%w: %v of %d participants", ErrMalformed, d, count)
	}
	asked := d
	// A decision already recorded is the answer (a coordinator resends its Decide when the
	// answer was lost): it needs no lease check, which fails while etcd is unreachable.
	e.mu.Lock()
	var got txnDecision
	recorded := false
	if err := e.usable(); err != nil {
		e.mu.Unlock()
		return base.DecisionNone, err
	}
	if rec := e.txnDecisions[id]; rec != nil {
		got, recorded = *rec, true
		// A resolver's abort (the only decision recorded without a count) learns it
		// from the coordinator, whatever it asks, as decideLocked does.
		e.learnCount(id, rec, count)
	}
	if !recorded {
		got, recorded = e.forgottenLocked(id)
	}
	e.mu.Unlock()
	if recorded {
		return e.answerDecision(id, asked, got)
	}
	if g, applied, err := e.decideGuardEarly(owner, id, lease, d); err != nil || g == guardNoPart && d == base.DecisionAbort || g == guardApplied {
		return g.answer(asked, applied, err)
	}
	var checked time.Time
	if d == base.DecisionCommit && e.opts.LeaseChecker != nil {
		alive, at, err := e.checkDecideLease(ctx, owner.conn, lease) // slots, shared (txn_lease.go)
		checked = at
		if err != nil {
			return base.DecisionNone, fmt.Errorf("storenode: decide %v: lease %d: %w", id, lease, err)
		}
		if !alive {
			d = base.DecisionAbort
		}
	}
	e.mu.Lock()
	if d == base.DecisionCommit && !checked.IsZero() && e.opts.Now().Sub(checked) > e.opts.TxnAbortKeep/2 {
		// An abort a resolver recorded after the check could have been forgotten already.
		e.mu.Unlock()
		return base.DecisionNone, fmt.Errorf("%w: decide %v: the lease check is older than half of the abort keep time", ErrTxnBusy, id)
	}
	if asked == base.DecisionCommit && d == base.DecisionAbort && e.forgotLostLocked(id) {
		e.mu.Unlock()
		return base.DecisionNone, fmt.Errorf("%w: decide %v: the lease is gone, and forgotten decisions gave way since %v: it may be a commit forgotten, no abort recorded", ErrTxnBusy, id, e.opts.TxnAbortKeep)
	}
	if g, err := e.decideGuardLocked(owner, id, lease, &d); err != nil || g.ends() {
		e.mu.Unlock()
		return g.answer(asked, d, err)
	}
	rec, err := e.decideLocked(id, lease, d, count, !owner.any) // a session's Decide: bounded per owner
	e.mu.Unlock()
	if err != nil {
		return base.DecisionNone, err
	}
	return e.answerDecision(id, asked, rec)
}

// answerDecision answers a Decide of asked with the recorded rec once its record is durable.
func (e *Engine) answerDecision(id base.TxnID, asked base.Decision, rec txnDecision) (base.Decision, error) {
	if err := e.waitDurable(rec.lsn); err != nil {
		return base.DecisionNone, err
	}
	if rec.d != asked {
		return rec.d, fmt.Errorf("%w: transaction %v: %v asked, %v recorded", ErrTxnDecided, id, asked, rec.d)
	}
	return rec.d, nil
}

// decideLocked is the compare-and-set: it returns the recorded decision (a copy), logging d
// if none was. A recorded decision other than d is returned as is; the caller names it.
// A new decision of a Decide (quota) is refused past its owner's bound (txn_decisions.go).
// Caller holds mu.
func (e *Engine) decideLocked(id base.TxnID, lease int64, d base.Decision, count int, quota bool) (txnDecision, error) {
	if err := e.usable(); err != nil {
		return txnDecision{}, err
	}
	e.sweepTxnDecisions()
	if rec := e.txnDecisions[id]; rec != nil {
		if rec.d == d {
			e.learnCount(id, rec, count) // an abort recorded by a resolver learns the count
		}
		return *rec, nil
	}
	if f, ok := e.forgottenLocked(id); ok {
		return f, nil // decided and forgotten while the lease was checked
	}
	if len(e.txnDecisions) >= e.opts.MaxTxns {
		return txnDecision{}, fmt.Errorf("%w: %d decisions kept", ErrTxnBusy, len(e.txnDecisions))
	}
	owner := e.decisionOwner(id)
	if quota {
		if err := e.checkDecisionQuota(owner); err != nil {
			return txnDecision{}, err
		}
	}
	e.scratch = appendTxnDecideRecord(e.scratch[:0], id, d, uint16(count), lease, 0)
	lsn, err := e.appendRecord(kindTxnDecide, e.scratch, true, noAck)
	if err != nil {
		return txnDecision{}, err
	}
	rec := &txnDecision{d: d, count: uint16(count), lease: lease, lsn: lsn, at: e.opts.Now()}
	e.countDecision(rec, owner)
	e.txnDecisions[id] = rec
	e.queueAbort(id, rec)
	e.startResolver()
	return *rec, nil
}

// AskTxn answers a participant's resolver at this node, the primary: the recorded decision
// of id; or, when none is recorded and the LeaseChecker says the coordinator's lease is gone,
// abort, recorded first (the compare-and-set of DecideTxn, so a late commit fails); else
// DecisionNone (undecided: ask again later). The answer is given only once its record is
// synced. ctx bounds the lease check.
func (e *Engine) AskTxn(ctx context.Context, id base.TxnID, lease int64) (base.Decision, error) {
	e.mu.Lock()
	if err := e.usable(); err != nil {
		e.mu.Unlock()
		return base.DecisionNone, err
	}
	rec := e.txnDecisions[id]
	var got txnDecision
	known := rec != nil
	if known {
		got = *rec
	} else {
		got, known = e.forgottenLocked(id)
	}
	e.mu.Unlock()
	if !known {
		if e.opts.LeaseChecker == nil {
			return base.DecisionNone, nil
		}
		alive, err := e.opts.LeaseChecker.LeaseAlive(ctx, lease)
		if err != nil {
			return base.DecisionNone, fmt.Errorf("storenode: resolve %v: lease %d: %w", id, lease, err)
		}
		if alive {
			return base.DecisionNone, nil
		}
		e.mu.Lock()
		got, err = e.decideLocked(id, lease, base.DecisionAbort, 0, false)
		e.mu.Unlock()
		if err != nil {
			return base.DecisionNone, err
		}
		e.stats.txnResolvedAborts.Add(1)
	}
	if err := e.waitDurable(got.lsn); err != nil {
		return base.DecisionNone, err
	}
	return got.d, nil
}

// ReportTxn records at this node, the primary, that participant index applied id's
// decision (logged and synced before it returns). A commit is forgotten once every
// participant reported; an unknown id (forgotten, or never decided here) is no error. A
// report already noted, or of an unknown id, returns only once every record logged so far
// is durable: the first report's record (or the one that forgot the commit) may still be
// on its way to the disk, and the participant forgets its part on this answer.
func (e *Engine) ReportTxn(id base.TxnID, index uint16) error {
	if index >= txnParticipantsMax {
		return fmt.Errorf("%w: report of participant %d", ErrMalformed, index)
	}
	e.mu.Lock()
	lsn, err := e.reportLocked(id, index)
	e.mu.Unlock()
	if err != nil || lsn == 0 {
		return err
	}
	return e.waitDurable(lsn)
}

func (e *Engine) reportLocked(id base.TxnID, index uint16) (uint64, error) {
	if err := e.usable(); err != nil {
		return 0, err
	}
	rec := e.txnDecisions[id]
	if rec == nil || rec.reported&(1<<index) != 0 {
		return e.lastLSN, nil // the record that noted it (or forgot id) is at most this
	}
	if rec.count > 0 && index >= rec.count {
		return 0, fmt.Errorf("%w: transaction %v: report of participant %d of %d", ErrMalformed, id, index, rec.count)
	}
	e.scratch = appendTxnReportedRecord(e.scratch[:0], id, index)
	lsn, err := e.appendRecord(kindTxnReported, e.scratch, true, noAck)
	if err != nil {
		return 0, err
	}
	e.noteReported(id, rec, index)
	return lsn, nil
}

// noteReported sets a report and forgets a commit every participant applied. Caller holds mu.
func (e *Engine) noteReported(id base.TxnID, rec *txnDecision, index uint16) {
	was := rec.allReported()
	rec.reported |= 1 << index
	if rec.d == base.DecisionCommit && rec.allReported() {
		e.forgetDecision(id, rec)
	} else if !was && rec.allReported() {
		e.queueAbortDone(id, rec) // forgotten by the next sweep once durable
	}
}

// txnForgotten is a decision forgotten by this node, its primary (Engine.txnForgot).
type txnForgotten struct {
	d   base.Decision
	at  time.Time // engine clock, when forgotten
	seq uint64    // its txnForgotQ entry's
}

// txnForgotEntry is one forgotten decision in the order forgotten.
type txnForgotEntry struct {
	id  base.TxnID
	seq uint64
}

// forgetDecision forgets a decision every participant reported (or an abort past
// Options.TxnAbortKeep) and remembers it in txnForgot, Options.TxnAbortKeep at most (the
// oldest give way past Options.TxnForgetMax): the coordinator's resend of a Decide whose answer
// it lost, after every participant's resolver learned the decision and reported, is
// answered with it, instead of recording abort (the lease gone: a committed transaction
// reported aborted) or a second commit nobody reports (a leak toward MaxTxns); an Ask is
// answered with it too. A coordinator that lost its answer for longer than TxnAbortKeep
// cannot trust an abort (docs/cluster.md, "What the coordinator must do"). Caller holds mu.
func (e *Engine) forgetDecision(id base.TxnID, rec *txnDecision) {
	delete(e.txnDecisions, id)
	e.countDecision(rec, 0)
	now := e.opts.Now()
	e.expireForgotten(now)
	if len(e.txnForgotQ) >= e.opts.TxnForgetMax {
		if q := e.txnForgotQ[0]; e.txnForgot[q.id].seq == q.seq {
			e.txnForgotLost = now // a young one gives way (the expired ones went above)
		}
		e.popForgotten()
	}
	e.txnForgotSeq++
	e.txnForgot[id] = txnForgotten{d: rec.d, at: now, seq: e.txnForgotSeq}
	e.txnForgotQ = append(e.txnForgotQ, txnForgotEntry{id: id, seq: e.txnForgotSeq})
}

// forgottenLocked returns the forgotten decision of id, as a record already durable, if
// remembered and younger than Options.TxnAbortKeep. Caller holds mu.
func (e *Engine) forgottenLocked(id base.TxnID) (txnDecision, bool) {
	f, ok := e.txnForgot[id]
	if !ok {
		return txnDecision{}, false
	}
	if e.opts.Now().Sub(f.at) >= e.opts.TxnAbortKeep {
		return txnDecision{}, false
	}
	return txnDecision{d: f.d, at: f.at}, true
}

// forgotLostLocked reports whether id is neither decided nor remembered forgotten here
// while a forgotten decision gave way less than Options.TxnAbortKeep ago (txnForgotLost):
// id may be one of them. Caller holds mu.
func (e *Engine) forgotLostLocked(id base.TxnID) bool {
	if e.txnForgotLost.IsZero() || e.opts.Now().Sub(e.txnForgotLost) >= e.opts.TxnAbortKeep || e.txnDecisions[id] != nil {
		return false
	}
	_, ok := e.forgottenLocked(id)
	return !ok
}

// expireForgotten drops the forgotten decisions older than Options.TxnAbortKeep. Caller
// holds mu.
func (e *Engine) expireForgotten(now time.Time) {
	for len(e.txnForgotQ) > 0 {
		f := e.txnForgot[e.txnForgotQ[0].id]
		if f.seq == e.txnForgotQ[0].seq && now.Sub(f.at) < e.opts.TxnAbortKeep {
			return
		}
		e.popForgotten()
	}
}

// popForgotten drops the oldest forgotten decision. Caller holds mu.
func (e *Engine) popForgotten() {
	q := e.txnForgotQ[0]
	if f, ok := e.txnForgot[q.id]; ok && f.seq == q.seq {
		delete(e.txnForgot, q.id)
	}
	e.txnForgotQ[0] = txnForgotEntry{}
	e.txnForgotQ = e.txnForgotQ[1:]
	if len(e.txnForgotQ) == 0 {
		e.txnForgotQ = nil
	}
}

// sweepTxnDecisions forgets the aborts every participant reported or older than
// Options.TxnAbortKeep, and drops the forgotten decisions past it. Caller holds mu. A forgotten abort is answered abort again by
// AskTxn (the lease is gone) and refuses a late commit (DecideTxn checks the lease first).
func (e *Engine) sweepTxnDecisions() {
	now := e.opts.Now()
	e.expireForgotten(now)
	// Both queues in the order their entries came (txn_forget.go): O(1) amortized, no scan
	// of the decisions under mu.
	durable := e.durableThrough()
	for len(e.txnAbortDoneQ) > 0 {
		q := e.txnAbortDoneQ[0]
		if rec := e.txnDecisions[q.id]; rec == q.rec && rec != nil {
			if q.lsn > durable {
				break
			}
			e.forgetDecision(q.id, rec)
		}
		e.txnVisited++
		e.txnAbortDoneQ[0] = txnAbortEntry{}
		e.txnAbortDoneQ = e.txnAbortDoneQ[1:]
	}
	for len(e.txnAbortQ) > 0 {
		q := e.txnAbortQ[0]
		if rec := e.txnDecisions[q.id]; rec == q.rec && rec != nil {
			if now.Sub(rec.at) < e.opts.TxnAbortKeep || rec.lsn > durable {
				break
			}
			e.forgetDecision(q.id, rec)
		}
		e.txnVisited++
		e.txnAbortQ[0] = txnAbortEntry{}
		e.txnAbortQ = e.txnAbortQ[1:]
	}
}

// ApplyTxn applies the decision d of transaction id at this participant: commit writes the
// prepared batch (as a Commit would, at the apply record's LSN), abort drops it; either way
// the rows are unlocked and the participant reports to the primary (its resolver, soon).
// Applying the same decision again is a no-op; the other one fails with ErrTxnDecided; an
// unknown id is no error (applied and reported before, or never prepared here: a
// coordinator sends commit only after every prepare was acknowledged, and a prepared part is
// kept until its decision is applied). An abort of an unknown id is remembered for
// Options.TxnAbortKeep: the transaction's prepare, if it comes after, is refused with
// ErrTxnDecided. It returns once the apply record is synced.
func (e *Engine) ApplyTxn(id base.TxnID, d base.Decision) error {
	return e.applyTxn(id, d, decider{any: true})
}

// applyTxn is ApplyTxn from by: a part prepared here by another owner than by's is refused,
// untouched (ApplyTxnAs), under the same hold of the engine lock as the apply.
func (e *Engine) applyTxn(id base.TxnID, d base.Decision, by decider) error {
	if d != base.DecisionCommit && d != base.DecisionAbort {
		return fmt.Errorf("%w: decision %d", ErrMalformed, d)
	}
	e.mu.Lock()
	if p := e.txnParts[id]; !by.any && p != nil && p.decision == base.DecisionNone && p.batch.Owner != by.owner {
		e.mu.Unlock()
		return fmt.Errorf("storenode: transaction %v: the part here was prepared by another owner: %w", id, base.ErrForbidden)
	}
	lsn, err := e.applyTxnLocked(id, d)
	e.mu.Unlock()
	if err != nil || lsn == 0 {
		return err
	}
	if err := e.waitDurable(lsn); err != nil {
		return err
	}
	e.kickResolver()
	return nil
}

func (e *Engine) applyTxnLocked(id base.TxnID, d base.Decision) (uint64, error) {
	var stallStart time.Time
	for {
		if err := e.usable(); err != nil {
			return 0, err
		}
		p := e.txnParts[id]
		if p == nil {
			if d == base.DecisionAbort {
				e.noteAbortedUnprepared(id)
			}
			return 0, nil
		}
		if p.decision != base.DecisionNone {
			if p.decision != d {
				return 0, fmt.Errorf("%w: transaction %v: this participant applied %v", ErrTxnDecided, id, p.decision)
			}
			return p.lsn, nil
		}
		if d == base.DecisionCommit {
			room, err := e.reserveFrames(&p.batch)
			if err != nil {
				return 0, err
			}
			if !room {
				if stallStart.IsZero() {
					stallStart = time.Now()
				}
				gen := e.ckptGen
				e.trig.stalled = true // a stall like a commit's (cacheTrigger)
				e.requestCheckpoint()
				for e.ckptGen == gen && e.usable() == nil {
					e.cond.Wait()
				}
				continue
			}
		}
		if !stallStart.IsZero() {
			e.stats.noteStall(time.Since(stallStart))
		}
		if err := e.carryPartFirst(p); err != nil {
			return 0, err
		}
		e.scratch = appendTxnApplyRecord(e.scratch[:0], id, d, p.index, p.primary)
		lsn, err := e.appendRecord(kindTxnApply, e.scratch, true, noAck)
		if err != nil {
			if d == base.DecisionCommit {
				e.unpinFrames(&p.batch, len(p.batch.Segments))
			}
			return 0, err
		}
		e.finishPart(p, d, lsn)
		if e.cachePressure() || e.walPressure() {
			e.requestCheckpoint()
		}
		return lsn, nil
	}
}

// noteAbortedUnprepared remembers an abort applied to a transaction not prepared here, so
// that its prepare, still on its way (a coordinator that gave up waiting for it aborts
// every participant: a prepare runs on a goroutine of its own and may land after the
// abort), is refused instead of locking its rows until a resolver hears the primary's
// abort, or, once the primary forgot it, until the coordinator's lease ends. Kept
// Options.TxnAbortKeep (the primary's own keep), at most Options.MaxTxns of them (the
// oldest give way). Caller holds mu.
func (e *Engine) noteAbortedUnprepared(id base.TxnID) {
	now := e.opts.Now()
	e.expireAbortedUnprepared(now) // O(1) amortized: txnAbortedQ, oldest first (txn_forget.go)
	if len(e.txnAbortedQ) >= e.opts.MaxTxns {
		e.popAbortedUnprepared()
	}
	e.txnAborted[id] = now
	e.txnAbortedQ = append(e.txnAbortedQ, txnAbortedEntry{id: id, at: now})
}

// finishPart applies (commit: frames reserved) or drops a prepared part at lsn and keeps it
// as applied, to be reported. Caller holds mu.
func (e *Engine) finishPart(p *txnPart, d base.Decision, lsn uint64) {
	e.unlockPart(p)
	e.txnPrepared--
	e.txnBytes -= int64(len(p.rec))
	e.ownerQuotaAdd(p.batch.Owner, -1, -len(p.rec))
	if d == base.DecisionCommit {
		e.applyBatch(&p.batch, lsn)
		e.unpinFrames(&p.batch, len(p.batch.Segments))
		e.stats.txnCommits.Add(1)
	} else {
		e.stats.txnAborts.Add(1)
	}
	p.decision, p.lsn, p.rec, p.batch = d, lsn, nil, base.Batch{}
}

// kickResolver asks the resolver loop for a pass now; it never blocks.
func (e *Engine) kickResolver() {
	select {
	case e.txnKick <- struct{}{}:
	default:
	}
}

// TxnStatus is a participant's view of one transaction, for tests and operations.
type TxnStatus struct {
	Prepared bool          // prepared, decision not applied
	Applied  base.Decision // applied, not yet reported to the primary
	Primary  base.Decision // this node's recorded decision, as primary (DecisionNone: none kept)
}

// TxnStatus reports what this node keeps of transaction id.
func (e *Engine) TxnStatus(id base.TxnID) TxnStatus {
	e.mu.Lock()
	defer e.mu.Unlock()
	var s TxnStatus
	if p := e.txnParts[id]; p != nil {
		s.Prepared = p.decision == base.DecisionNone
		s.Applied = p.decision
	}
	if d := e.txnDecisions[id]; d != nil {
		s.Primary = d.d
	}
	return s
}

// TxnCounts reports the parts kept (prepared or applied and unreported) and the decisions
// kept.
func (e *Engine) TxnCounts() (parts, decisions int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.txnParts), len(e.txnDecisions)
}

// txnSegmentsMax bounds a prepared batch's segments: reserveFrames' bound of one batch.
const txnSegmentsMax = 1 << 16

// startResolver starts the resolver loop, once, when the engine first keeps a transaction
// (an engine that never sees one runs no resolver). Caller holds mu, with the engine open.
func (e *Engine) startResolver() {
	if e.resolveCtx != nil || e.replaying || e.closed || e.opts.TxnResolveInterval <= 0 {
		return
	}
	e.resolveCtx, e.resolveCancel = context.WithCancel(context.Background())
	e.bg.Add(1)
	go e.resolveLoop()
}

// resolveLoop runs ResolveTxns every Options.TxnResolveInterval and when kicked, while
// anything is kept (a pass also forgets the aborts past TxnAbortKeep).
func (e *Engine) resolveLoop() {
	defer e.bg.Done()
	t := time.NewTicker(e.opts.TxnResolveInterval)
	defer t.Stop()
	ctx := e.resolveCtx // Close cancels it: every call of the resolver in flight ends
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
		case <-e.txnKick:
		}
		if parts, decisions := e.TxnCounts(); parts == 0 && decisions == 0 {
			continue
		}
		if err := e.ResolveTxns(ctx); err != nil {
			e.opts.Logger.Debug("storenode: resolve transactions", "err", err)
		}
	}
}

// carryTxns re-logs every applied part and decision after the checkpoint LSN (see the file
// doc) and returns the last LSN it appended (0 when none); the prepared parts are listed to
// be carried after this hold, in chunks (carryPrepared, txn_quota.go). Caller holds mu, in
// the same hold as the checkpoint's snapshot.
func (e *Engine) carryTxns() (uint64, error) {
	var last uint64
	e.carryBegin()
	for _, p := range e.txnParts {
		if p.decision == base.DecisionNone {
			e.carryLater(p.id)
			continue
		}
		e.scratch = appendTxnApplyRecord(e.scratch[:0], p.id, p.decision, p.index, p.primary)
		lsn, err := e.appendRecord(kindTxnApply, e.scratch, false, noAck)
		if err != nil {
			return 0, err
		}
		last = lsn
	}
	for id, d := range e.txnDecisions {
		e.scratch = appendTxnDecideRecord(e.scratch[:0], id, d.d, d.count, d.lease, d.reported)
		lsn, err := e.appendRecord(kindTxnDecide, e.scratch, false, noAck)
		if err != nil {
			return 0, err
		}
		last = lsn
	}
	// The newest Options.MaxTxns forgotten decisions too (a resend comes soon after the
	// first Decide; the bound keeps this hold as short as the live decisions' carry), as
	// decisions every participant reported (count 64, all reported): replay forgets them
	// again, so a restart keeps answering a resent Decide. Skipped: the expired ones, and an
	// id decided again since (its record is carried above).
	now := e.opts.Now()
	for _, q := range e.txnForgotQ[max(0, len(e.txnForgotQ)-e.opts.MaxTxns):] {
		f, ok := e.txnForgot[q.id]
		if !ok || f.seq != q.seq || now.Sub(f.at) >= e.opts.TxnAbortKeep || e.txnDecisions[q.id] != nil {
			continue
		}
		e.scratch = appendTxnDecideRecord(e.scratch[:0], q.id, f.d, txnParticipantsMax, 0, ^uint64(0))
		lsn, err := e.appendRecord(kindTxnDecide, e.scratch, false, noAck)
		if err != nil {
			return 0, err
		}
		last = lsn
	}
	return last, nil
}

// txnLive reports whether any part or decision is kept. Caller holds mu.
func (e *Engine) txnLive() bool { return len(e.txnParts) > 0 || len(e.txnDecisions) > 0 }

// replayTxn applies one txn record in recovery. Caller holds mu.
func (e *Engine) replayTxn(kind byte, lsn uint64, payload []byte) error {
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
		e.installPart(p)
		if d := e.txnDecisions[pr.id]; d != nil && d.owner == 0 && p.primary == "" {
			e.countDecision(d, c.owner) // the decision was carried before its part
		}
		if o := e.owners[c.owner]; o == nil || c.seq > o.lastSeq {
			e.owner(c.owner).remember(c.seq, lsn, c.hash)
		}
	case kindTxnApply:
		id, d, index, primary, err := decodeTxnApplyRecord(payload)
		if err != nil {
			return fmt.Errorf("storenode: replay: record %d: %w", lsn, err)
		}
		p := e.txnParts[id]
		switch {
		case p == nil:
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
		rec := e.txnDecisions[id]
		if rec != nil && rec.d != d {
			// The live engine forgot rec (an abort past TxnAbortKeep, in memory only) and,
			// once its memory of it expired too, recorded id's decision afresh: the later
			// record replaces it, as it did there.
			delete(e.txnDecisions, id)
			e.countDecision(rec, 0)
			rec = nil
		}
		if rec == nil {
			rec = &txnDecision{d: d, count: count, lease: lease, lsn: lsn, at: e.opts.Now()}
			e.countDecision(rec, e.decisionOwner(id))
			e.txnDecisions[id] = rec
			e.queueAbort(id, rec)
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
	case kindTxnReported:
		id, index, err := decodeTxnReportedRecord(payload)
		if err != nil {
			return fmt.Errorf("storenode: replay: record %d: %w", lsn, err)
		}
		if rec := e.txnDecisions[id]; rec != nil {
			e.noteReported(id, rec, index)
		}
	case kindTxnForgot:
		if err := decodeTxnForgotRecord(payload, e.replayForgot); err != nil {
			return fmt.Errorf("storenode: replay: record %d: %w", lsn, err)
		}
	}
	return nil
}

// replayFits checks a replayed batch's segments against the catalog, as replayCommit does.
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
