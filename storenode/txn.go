package storenode

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/assert"
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
//     by at most the dirty pages of the WAL being replayed). A replica's checkpoint
//     (Options.Proposer set) carries nothing: it writes the same state to its sidecar
//     (snapshotTxnState, txnstate.go).
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
	var (
		lsn uint64
		err error
	)
	if e.replicated() {
		lsn, err = e.prepareProposed(p, hash) // txn_repl.go
	} else {
		lsn, err = e.prepareLocked(p, hash)
	}
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
		if err := e.moveDrains(b); err != nil {
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
	if err := e.prepareAdmits(p.Txn, p.Primary, b, prepareSize(p), true); err != nil {
		return 0, err
	}
	rec, part, err := e.preparePart(p, hash)
	if err != nil {
		return 0, err
	}
	lsn, err := e.appendRecord(kindTxnPrepare, rec, true, noAck)
	if err != nil {
		return 0, err
	}
	part.lsn = lsn
	e.applyPrepare(part)
	e.cond.Broadcast()
	return lsn, nil
}

func noAck(uint64, error) {}

// prepareAdmits is the check of a prepare of transaction id (primary, batch b, a record of
// size bytes) after its seq's: the transaction not prepared or applied here, nor aborted by
// this primary; when clock, nor decided and forgotten by this primary, nor aborted here before
// it came, both within Options.TxnAbortKeep on the engine clock (a replica's apply leaves
// those to the leader: txn_repl.go); its rows not locked; room for it (parts, bytes, the
// owner's quota). Caller holds mu.
func (e *Engine) prepareAdmits(id base.TxnID, primary string, b *base.Batch, size int, clock bool) error {
	if old := e.txnParts[id]; old != nil {
		if old.decision != base.DecisionNone {
			return fmt.Errorf("%w: transaction %v: this participant applied %v", ErrTxnDecided, id, old.decision)
		}
		return fmt.Errorf("%w: transaction %v is prepared here under another seq", ErrMalformed, id)
	}
	if d := e.txnDecisions[id]; d != nil && primary == "" && d.d == base.DecisionAbort {
		return fmt.Errorf("%w: transaction %v: the primary recorded abort", ErrTxnDecided, id)
	}
	if clock && primary == "" && len(e.txnForgot) > 0 {
		if f, ok := e.forgottenLocked(id); ok {
			return fmt.Errorf("%w: transaction %v: the primary decided %v (and forgot it)", ErrTxnDecided, id, f.d)
		}
	}
	if at, ok := e.txnAborted[id]; ok && clock {
		if e.opts.Now().Sub(at) < e.opts.TxnAbortKeep {
			return fmt.Errorf("%w: transaction %v: abort was applied here before this prepare came", ErrTxnDecided, id)
		}
		delete(e.txnAborted, id)
	}
	if err := e.checkTxnLocks(b.Segments); err != nil {
		return err
	}
	if err := e.txnPartsRoom(); err != nil {
		return err
	}
	if e.txnBytes+int64(size) > e.opts.MaxTxnBytes {
		return fmt.Errorf("%w: %d bytes of prepared batches held, %d more would pass the limit %d", ErrTxnBusy, e.txnBytes, size, e.opts.MaxTxnBytes)
	}
	return e.checkOwnerQuota(b.Owner, size)
}

// prepareSize is the size of p's prepare record.
func prepareSize(p *base.TxnPrepare) int {
	b := p.Batch
	size := txnPrepareFixed + padTo8(len(p.Primary)) + commitHashBytes + commitBodyFixedBytes + commitFenceBytes*len(b.Fences)
	for i := range b.Segments {
		size += commitSegmentHeaderBytes + len(b.Segments[i].Rows)
	}
	return size
}

// preparePart encodes p's prepare record, owned (the part keeps it, the batch's rows alias
// it, until applied), and the part it makes, lsn not set. Caller holds mu.
func (e *Engine) preparePart(p *base.TxnPrepare, hash uint64) ([]byte, *txnPart, error) {
	b := p.Batch
	size := prepareSize(p)
	rec := make([]byte, 0, size)
	rec = appendTxnPrepareHeader(rec, p.Txn, p.Lease, p.Index, p.Primary)
	rec = appendCommitRecord(rec, b, hash, func(t uint32) int { return e.tables[t].geo.RowBytes() })
	assert.That(len(rec) == size, "storenode: prepare record size")
	part := &txnPart{id: p.Txn, lease: p.Lease, primary: p.Primary, index: p.Index, hash: hash, at: e.opts.Now(), rec: rec}
	var pr txnPrepareRecord
	if err := decodeTxnPrepareRecord(rec, &pr); err != nil {
		return nil, nil, fmt.Errorf("storenode: prepare: own record: %w", err)
	}
	part.batch = base.Batch{Owner: b.Owner, Seq: b.Seq, Fences: pr.commit.fences, Segments: pr.commit.segments}
	return rec, part, nil
}

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
