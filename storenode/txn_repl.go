package storenode

import (
	"fmt"
	"time"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/storenode/wal"
)

// Two-phase commit on a replica (docs/replication.md 1.2; proposer.go): a prepare (kind 8)
// and a decision (kind 9) are checked on the leader and proposed; every replica applies them
// in ApplyCommitted, rechecked against its applied state alone.
//
// Invariants:
//   - what decides an entry's outcome at apply is the applied state only, so every replica
//     decides alike: a prepare's dedup window (a seq applied is answered from it, never
//     prepared twice), fences, locks, seq order, the part or the primary's abort already
//     there, the bounds on parts, bytes and the owner's quota; a decision's compare-and-set
//     (the first decision applied is the one kept; a later entry is answered with it) and
//     the bound on decisions kept.
//   - what is decided on a clock is decided on the leader before it proposes (D3): a
//     prepare refused for a decision this primary forgot, or for an abort applied here before
//     it came (txnAborted: the leader's soft state, as ApplyTxn of an unknown id logs
//     nothing), both within Options.TxnAbortKeep; a decision's lease check in etcd.
//   - a replica sweeps no decision on its own clock: the leader's resolver pass proposes the
//     aborts its sweep would forget (proposeTxnExpiry, kindTxnExpired) and every replica
//     forgets them at the entry, if still the abort of that decide LSN. An abort kept without
//     a count learns it from a later Decide by an entry too (proposeLearnCount: a decide
//     record of the same decision; its apply sets the count of a kept abort of none). Nor does it
//     drop a forgotten decision by age (expireForgotten): the forgotten decisions it remembers
//     follow the log; their age (at, each replica's clock) is the leader's check alone. A decision's apply (11) and a participant's report (10) are
//     proposed and applied as prepares are; the resolver runs on the leader only
//     (ResolveTxns), through the same calls, and proposes its forgot records (12, not
//     forced, nobody waits: lost with a leadership, the parts are reported again).
//   - a part's at (TxnsInDoubt) is each replica's own clock at apply: soft state.

// prepareProposed is prepareLocked under a Proposer, mu held: checked against the applied
// state plus the owner's commits and prepares proposed (a seq gap waits, at most
// Options.SeqGapWait), proposed, and answered once applied (mu released meanwhile) with the
// index of the entry that prepared it (a retry: of the first).
func (e *Engine) prepareProposed(p *base.TxnPrepare, hash uint64) (uint64, error) {
	b := p.Batch
	var gapDeadline time.Time
	for {
		if e.closed {
			return 0, ErrClosed
		}
		if err := e.checkLeader(); err != nil {
			return 0, err
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
		ps, pending := e.repl.seqs[b.Owner]
		last, known := ps.seq, pending
		if o != nil {
			last, known = max(last, o.lastSeq), true
		}
		if !known || b.Seq <= last+1 {
			break
		}
		if o != nil {
			if err := o.refusedGap(b.Seq); err != nil {
				return 0, err
			}
		}
		if gapDeadline.IsZero() {
			gapDeadline = time.Now().Add(e.opts.SeqGapWait)
			timer := time.AfterFunc(e.opts.SeqGapWait, e.wake)
			defer timer.Stop()
		}
		if !time.Now().Before(gapDeadline) {
			return 0, fmt.Errorf("%w: batch seq %d, last applied or proposed %d", ErrSeqGap, b.Seq, last)
		}
		e.gapWaiters++
		e.cond.Wait()
		e.gapWaiters--
	}
	if err := e.prepareAdmits(p.Txn, p.Primary, b, prepareSize(p), true); err != nil {
		return 0, err
	}
	rec, _, err := e.preparePart(p, hash)
	if err != nil {
		return 0, err
	}
	type outcome struct {
		index uint64
		err   error
	}
	ch := make(chan outcome, 1)
	e.onePiece[0] = wal.Piece{Bytes: rec}
	err = e.propose(kindTxnPrepare, e.onePiece[:], true, &proposal{owner: b.Owner, done: func(index uint64, err error) { ch <- outcome{index, err} }})
	e.onePiece[0] = wal.Piece{}
	if err != nil {
		return 0, err
	}
	if e.repl.seqs == nil {
		e.repl.seqs = make(map[uint64]pendSeq)
	}
	ps := e.repl.seqs[b.Owner]
	e.repl.seqs[b.Owner] = pendSeq{seq: max(ps.seq, b.Seq), n: ps.n + 1}
	e.mu.Unlock()
	r := <-ch
	e.mu.Lock()
	return r.index, r.err
}

// applyPrepareEntry applies a committed prepare entry at index, decided on the applied state
// alone (see the file doc). Caller holds mu.
func (e *Engine) applyPrepareEntry(payload []byte, index uint64) (uint64, error, error) {
	var pr txnPrepareRecord
	if err := decodeTxnPrepareRecord(payload, &pr); err != nil {
		return 0, nil, err
	}
	c := &pr.commit
	if c.owner == 0 || c.owner == MoveWriter || c.seq == 0 {
		return 0, nil, corrupt.Errorf("storenode: apply entry %d: prepare of owner %d seq %d", index, c.owner, c.seq)
	}
	b := &base.Batch{Owner: c.owner, Seq: c.seq, Fences: c.fences, Segments: c.segments}
	o := e.owners[b.Owner]
	if o != nil && b.Seq <= o.lastSeq {
		e.stats.retried.Add(1)
		lsn, err := o.retried(b, c.hash)
		return lsn, err, nil
	}
	if err := e.checkBatch(b); err != nil {
		return 0, err, nil
	}
	if o != nil && b.Seq != o.lastSeq+1 {
		return 0, fmt.Errorf("%w: batch seq %d, last applied %d", ErrSeqGap, b.Seq, o.lastSeq), nil
	}
	for i := range c.rowBytes {
		if t := e.tables[b.Segments[i].Table]; t.geo.RowBytes() != c.rowBytes[i] {
			return 0, fmt.Errorf("%w: table %q has rows of %d bytes, the batch %d", ErrRowSize, t.name, t.geo.RowBytes(), c.rowBytes[i]), nil
		}
	}
	if err := e.prepareAdmits(pr.id, pr.primary, b, len(payload), false); err != nil {
		return 0, err, nil
	}
	rec := append([]byte(nil), payload...) // the log's buffer is not ours
	if err := decodeTxnPrepareRecord(rec, &pr); err != nil {
		return 0, nil, err
	}
	part := &txnPart{id: pr.id, lease: pr.lease, primary: pr.primary, index: pr.index, hash: c.hash, lsn: index, at: e.opts.Now(), rec: rec,
		batch: base.Batch{Owner: c.owner, Seq: c.seq, Fences: pr.commit.fences, Segments: pr.commit.segments}}
	e.applyPrepare(part)
	return index, nil, nil
}

// decideProposed is decideLocked's record under a Proposer, mu held, its checks made: the
// decision is proposed and the decision kept once it is applied returned (mu released
// meanwhile): d, or the one an entry applied first recorded.
func (e *Engine) decideProposed(id base.TxnID, lease int64, d base.Decision, count int) (txnDecision, error) {
	if err := e.checkLeader(); err != nil {
		return txnDecision{}, err
	}
	e.scratch = appendTxnDecideRecord(e.scratch[:0], id, d, uint16(count), lease, 0)
	if _, err := e.proposeWait(kindTxnDecide, e.scratch); err != nil {
		return txnDecision{}, err
	}
	if rec := e.txnDecisions[id]; rec != nil {
		return *rec, nil
	}
	if f, ok := e.forgottenLocked(id); ok {
		return f, nil
	}
	return txnDecision{}, fmt.Errorf("%w: decision of %v applied, then forgotten before it was answered", ErrUnknownOutcome, id)
}

// applyDecideEntry applies a committed decide entry at index: the first decision of an id
// applied is kept (a later entry of it changes nothing and is answered with the kept one);
// a new one past Options.MaxTxns kept is refused. Caller holds mu.
func (e *Engine) applyDecideEntry(payload []byte, index uint64) (uint64, error, error) {
	id, d, count, lease, reported, err := decodeTxnDecideRecord(payload)
	if err != nil {
		return 0, nil, err
	}
	if reported != 0 {
		return 0, nil, corrupt.Errorf("storenode: apply entry %d: a decision proposed with reports %#x", index, reported)
	}
	if rec := e.txnDecisions[id]; rec != nil {
		if rec.d == d && rec.count == 0 && count > 0 {
			e.setCount(id, rec, int(count)) // a count learned (proposeLearnCount), or a racing Decide's
		}
		return rec.lsn, nil, nil
	}
	if len(e.txnDecisions) >= e.opts.MaxTxns {
		return 0, fmt.Errorf("%w: %d decisions kept", ErrTxnBusy, len(e.txnDecisions)), nil
	}
	e.applyDecide(id, d, count, lease, 0, index)
	e.startResolver()
	return index, nil, nil
}

// proposeWait proposes a forced one-piece record and waits for its outcome, mu released
// meanwhile: the index it names, or the refusal decided at apply. Caller holds mu; it is held
// again on return.
func (e *Engine) proposeWait(kind byte, payload []byte) (uint64, error) {
	type outcome struct {
		index uint64
		err   error
	}
	ch := make(chan outcome, 1)
	e.onePiece[0] = wal.Piece{Bytes: payload}
	err := e.propose(kind, e.onePiece[:], true, &proposal{done: func(index uint64, err error) { ch <- outcome{index, err} }})
	e.onePiece[0] = wal.Piece{}
	if err != nil {
		return 0, err
	}
	e.mu.Unlock()
	r := <-ch
	e.mu.Lock()
	return r.index, r.err
}

// applyTxnProposed is applyTxnLocked under a Proposer, mu held: an unknown id's abort is
// remembered on the leader (txnAborted: soft state), a part's decision applied before is
// answered, else the apply is proposed and answered once applied.
func (e *Engine) applyTxnProposed(id base.TxnID, d base.Decision) (uint64, error) {
	if err := e.usable(); err != nil {
		return 0, err
	}
	if err := e.checkLeader(); err != nil {
		return 0, err
	}
	p := e.txnParts[id]
	switch {
	case p == nil:
		if d == base.DecisionAbort {
			e.noteAbortedUnprepared(id)
		}
		return 0, nil
	case p.decision == d:
		return p.lsn, nil
	case p.decision != base.DecisionNone:
		return 0, fmt.Errorf("%w: transaction %v: this participant applied %v", ErrTxnDecided, id, p.decision)
	}
	e.scratch = appendTxnApplyRecord(e.scratch[:0], id, d, p.index, p.primary)
	return e.proposeWait(kindTxnApply, e.scratch)
}

// applyApplyEntry applies a committed apply entry at index to the part it names, if still
// prepared (commit: frames reserved first, waiting for a checkpoint if the cache is full); a
// part applied before answers with its apply's index, or ErrTxnDecided for the other
// decision; an unknown id changes nothing. Caller holds mu; it may wait with mu released.
func (e *Engine) applyApplyEntry(payload []byte, index uint64) (uint64, error, error) {
	id, d, _, _, err := decodeTxnApplyRecord(payload)
	if err != nil {
		return 0, nil, err
	}
	for {
		p := e.txnParts[id]
		switch {
		case p == nil:
			return index, nil, nil // applied, reported and forgotten since the proposal
		case p.decision == d:
			return p.lsn, nil, nil
		case p.decision != base.DecisionNone:
			return 0, fmt.Errorf("%w: transaction %v: this participant applied %v", ErrTxnDecided, id, p.decision), nil
		}
		if d == base.DecisionCommit {
			room, err := e.reserveFrames(&p.batch)
			if err != nil {
				return 0, nil, err
			}
			if !room {
				// Full of dirty pages: wait for a checkpoint to clean some, as a commit does.
				gen := e.ckptGen
				e.trig.stalled = true
				e.requestCheckpoint()
				for e.ckptGen == gen && e.usable() == nil {
					e.cond.Wait()
				}
				if err := e.usable(); err != nil {
					return 0, nil, err
				}
				continue // the part is looked up again: mu was released
			}
		}
		e.finishPart(p, d, index)
		if e.cachePressure() {
			e.requestCheckpoint()
		}
		return index, nil, nil
	}
}

// reportProposed is reportLocked under a Proposer, mu held, id's decision kept and the
// report new: the report is proposed and answered once applied.
func (e *Engine) reportProposed(id base.TxnID, index uint16) (uint64, error) {
	if err := e.checkLeader(); err != nil {
		return 0, err
	}
	e.scratch = appendTxnReportedRecord(e.scratch[:0], id, index)
	return e.proposeWait(kindTxnReported, e.scratch)
}

// applyReportedEntry applies a committed report entry at index: noted if id's decision is
// kept and the report new and within its count (a commit every participant reported is
// forgotten, as live); else nothing changes. Caller holds mu.
func (e *Engine) applyReportedEntry(payload []byte, index uint64) (uint64, error, error) {
	id, n, err := decodeTxnReportedRecord(payload)
	if err != nil {
		return 0, nil, err
	}
	rec := e.txnDecisions[id]
	if rec == nil || rec.reported&(1<<n) != 0 {
		return index, nil, nil
	}
	if rec.count > 0 && n >= rec.count {
		return 0, fmt.Errorf("%w: transaction %v: report of participant %d of %d", ErrMalformed, id, n, rec.count), nil
	}
	e.noteReported(id, rec, n)
	return index, nil, nil
}

// proposeForgot proposes the forgot record of ids, applied parts whose reports the primary
// acknowledged (forgetReported); every replica forgets them at its apply. Caller holds mu.
func (e *Engine) proposeForgot(ids []base.TxnID) {
	e.onePiece[0] = wal.Piece{Bytes: appendTxnForgotRecord(nil, ids)} // copied by Propose
	err := e.propose(kindTxnForgot, e.onePiece[:], false, &proposal{done: func(uint64, error) {}})
	e.onePiece[0] = wal.Piece{}
	if err != nil {
		e.opts.Logger.Debug("storenode: forgot record not proposed", "parts", len(ids), "err", err)
	}
}

// proposeTxnExpiry is sweepTxnDecisions on a replica's leader, mu held: the aborts the sweep
// would forget (every participant reported, the records durable; or older than
// Options.TxnAbortKeep on the leader's clock) are proposed, each with its decide LSN, at most
// expiredTxnsMax at a time and one record waiting at a time; every replica forgets them at
// the entry's apply (applyTxnExpired). The forgotten decisions past the keep are dropped here,
// as the sweep does (each replica's soft state). Nobody waits: an expiry lost with a
// leadership is decided again by the next leader.
func (e *Engine) proposeTxnExpiry() {
	now := e.opts.Now()
	e.expireForgotten(now)
	if e.repl.expiringTxns || e.checkLeader() != nil {
		return
	}
	durable := e.durableThrough()
	var txns []expiredTxn
	named := make(map[base.TxnID]bool)
	add := func(id base.TxnID, rec *txnDecision) {
		if !named[id] {
			named[id] = true
			txns = append(txns, expiredTxn{id: id, lsn: rec.lsn})
		}
	}
	// Both queues in the order their entries came, as the sweep: the stale heads (decisions
	// forgotten or replaced since) are dropped, the candidates kept until their entry applies.
	for len(e.txnAbortDoneQ) > 0 && e.txnDecisions[e.txnAbortDoneQ[0].id] != e.txnAbortDoneQ[0].rec {
		e.txnVisited++
		e.txnAbortDoneQ[0] = txnAbortEntry{}
		e.txnAbortDoneQ = e.txnAbortDoneQ[1:]
	}
	for _, q := range e.txnAbortDoneQ {
		if len(txns) == expiredTxnsMax {
			break
		}
		e.txnVisited++
		if rec := e.txnDecisions[q.id]; rec == q.rec && rec != nil {
			if q.lsn > durable {
				break
			}
			add(q.id, rec)
		}
	}
	for len(e.txnAbortQ) > 0 && e.txnDecisions[e.txnAbortQ[0].id] != e.txnAbortQ[0].rec {
		e.txnVisited++
		e.txnAbortQ[0] = txnAbortEntry{}
		e.txnAbortQ = e.txnAbortQ[1:]
	}
	for _, q := range e.txnAbortQ {
		if len(txns) == expiredTxnsMax {
			break
		}
		e.txnVisited++
		if rec := e.txnDecisions[q.id]; rec == q.rec && rec != nil {
			if now.Sub(rec.at) < e.opts.TxnAbortKeep || rec.lsn > durable {
				break
			}
			add(q.id, rec)
		}
	}
	if len(txns) == 0 {
		return
	}
	e.onePiece[0] = wal.Piece{Bytes: appendTxnExpiredRecord(nil, txns)} // copied by Propose
	err := e.propose(kindTxnExpired, e.onePiece[:], false, &proposal{done: func(uint64, error) {}})
	e.onePiece[0] = wal.Piece{}
	if err != nil {
		e.opts.Logger.Debug("storenode: decision expiry not proposed", "decisions", len(txns), "err", err)
		return
	}
	e.repl.expiringTxns = true
}

// applyTxnExpired forgets the abort a decision expiry record names if it is still the one
// decided at its LSN (a decision applied since, or one already forgotten, is left). Caller
// holds mu.
func (e *Engine) applyTxnExpired(x expiredTxn) {
	if rec := e.txnDecisions[x.id]; rec != nil && rec.d == base.DecisionAbort && rec.lsn == x.lsn {
		e.forgetDecision(x.id, rec)
	}
}

// proposeLearnCount is learnCount on a replica's leader, mu held: a decide record of rec's
// decision with count is proposed, and every replica sets the count of the abort kept
// without one at its apply (applyDecideEntry). Nobody waits: the Decide is answered with the
// decision kept; a count lost with a leadership is learned from the next Decide, or the
// abort is forgotten by age.
func (e *Engine) proposeLearnCount(id base.TxnID, rec *txnDecision, count int) {
	if e.checkLeader() != nil {
		return
	}
	e.onePiece[0] = wal.Piece{Bytes: appendTxnDecideRecord(nil, id, rec.d, uint16(count), rec.lease, 0)} // copied by Propose
	err := e.propose(kindTxnDecide, e.onePiece[:], true, &proposal{done: func(uint64, error) {}})
	e.onePiece[0] = wal.Piece{}
	if err != nil {
		e.opts.Logger.Debug("storenode: a decision's count not proposed", "txn", id.String(), "err", err)
	}
}
