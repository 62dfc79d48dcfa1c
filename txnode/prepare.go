package txnode

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/logicpage"
	"github.com/weftdb/weft/txnode/internal/coordbridge"
	"github.com/weftdb/weft/txnode/store"
)

// Two-phase commit, the participant's side in a transaction node (docs/cluster.md,
// "Two-phase commit"). A coordinator (package cluster/node) runs one Tx per transaction
// node (per storage node) and, when more than one writes, prepares each (txncoord.Prepare),
// records the decision at the primary (txncoord.DecideTxn) and applies it to every part
// (Prepared.Apply). The implementation is here, unexported; package txnode/txncoord is its
// API (internal/coordbridge hands it over).
//
// Invariants:
//   - Prepare validates exactly as Commit does (the write set locked, Silo's insert rule,
//     every read checked, every touched table's lease or grant checked), then, in place of
//     handing the rows to a commit batch and installing them, sends them as one TxnPrepare
//     under the owner's next seq (the pipeline's seq order: every batch admitted before is
//     sent first, no batch after it is sent until the storage node answered it) with a fence
//     per table written, and keeps the rows LOCKED in this node's cache.
//   - A prepared row stays locked until the decision is applied at this part's storage node
//     (Prepared.Apply answered), which is after it is durable at the primary: only then does
//     commit install the values under a new commit version (abort leaves the old ones), and
//     unlock. Until then a local reader or writer of the row parks on it, bounded by its own
//     context (the row's version word is locked, as during any commit), and a transaction
//     that read it before it was locked fails validation with ErrConflict (DB.Update retries
//     it). Prepared bytes are never visible: they are not in the cache until installed.
//   - Nothing of this survives a crash of the transaction node: its cache is gone, and the
//     storage nodes' resolvers finish the transaction.
//
// A refused prepare (ErrTxnLocked, ErrTxnDecided, ErrTxnBusy, ErrFenced, ...) takes no seq,
// unlocks the rows and returns the error. A prepare whose answer never came (the context
// ended, the storage node's WAL failed) may have landed: Prepare returns the Prepared with
// an error wrapping ErrUnknownOutcome, to be aborted (Apply(DecisionAbort)); the pipeline
// holds its later batches until the prepare, sent again in the background, is answered
// (the seq is taken, or given back).

// txnInfo names a transaction of a two-phase commit and this part in it (txncoord.TxnInfo).
type txnInfo = coordbridge.TxnInfo

// prepared is a transaction prepared at this node's storage node (txncoord.Prepared): its
// rows are locked in the cache until apply (or abandon). Its methods are for one goroutine at
// a time (the coordinator's), which may hand it to another.
type prepared coordbridge.Part[Tx]

// txnStore returns db's store's two-phase commit side.
func (db *DB) txnStore() (store.TxnStore, error) {
	ts, ok := db.store.(store.TxnStore)
	if !ok {
		return nil, coordbridge.ErrNoTxnStore
	}
	return ts, nil
}

// prepare validates the transaction as Commit would and prepares it at the storage node as
// part info.Index of transaction info.ID, keeping its rows locked here (see the invariants
// above). The transaction must have written something (a part that only read is checked
// with validateLive). It returns:
//   - (p, nil): prepared; decide, then p.apply the decision.
//   - (nil, err): not prepared, the rows unlocked, the Tx finished: ErrConflict (a read
//     changed, or a row to write is locked by another transaction committing or prepared
//     here: retry the whole transaction), the storage node's refusal (ErrTxnLocked,
//     ErrFenced, ...), a lease or grant error.
//   - (p, err wrapping ErrUnknownOutcome): the prepare may have landed; abort it (p.apply
//     of DecisionAbort), never commit.
//
// The Tx must come from DB.Begin. It is finished either way (its methods return ErrTxDone,
// Rollback is a no-op); p holds it. txncoord.Prepare is prepareLock, then prepareSend into
// its own Prepared.
func (tx *Tx) prepare(info txnInfo) (*prepared, error) {
	ts, err := tx.prepareLock()
	if err != nil {
		return nil, err
	}
	p := new(prepared)
	held, err := tx.prepareSend(ts, info, p)
	if !held {
		return nil, err
	}
	return p, err
}

// prepareLock is prepare up to its validation: nil when the write set is locked and every
// read validated, else the Tx is finished (but for a closure's Tx) and the rows unlocked.
func (tx *Tx) prepareLock() (store.TxnStore, error) {
	if tx.done {
		return nil, ErrTxDone
	}
	if !tx.writable {
		tx.Rollback()
		return nil, ErrReadOnly
	}
	if !tx.manual {
		// A closure's Tx (DB.Update) is committed by its retry loop.
		return nil, errors.New("txnode: Prepare of a transaction not from Begin")
	}
	db := tx.db
	ts, err := db.txnStore()
	if err == nil && len(tx.writes) == 0 {
		err = fmt.Errorf("txnode: prepare of a transaction that wrote nothing (validate it instead)")
	}
	if err == nil && tx.busy.t != nil {
		err = errCacheBusy
	}
	if err != nil {
		tx.Rollback()
		return nil, err
	}
	tx.sortWrites()
	if err := tx.leasesLive(); err != nil {
		tx.Rollback()
		return nil, err
	}
	// Try-locks: a prepare holds its rows for a round trip or more, and its coordinator may
	// hold rows of other transaction nodes prepared meanwhile: waiting here for a row held
	// by another coordinator's prepare could deadlock the two. A held row is a conflict
	// (the retry's reads park on it until it is decided).
	for i := range tx.writes {
		if !tx.tryLockRow(&tx.writes[i]) {
			tx.unlockAll()
			db.stats.aborts.Add(1)
			tx.Rollback()
			return nil, ErrConflict
		}
	}
	if err := tx.bumpInserts(); err != nil {
		tx.Rollback()
		return nil, err
	}
	if !tx.validate() {
		tx.unlockAll()
		db.stats.aborts.Add(1)
		tx.Rollback()
		return nil, ErrConflict
	}
	return ts, nil
}

// prepareSend is the rest of prepare, after prepareLock: it sends the prepare and fills p.
// held reports whether p holds the Tx (prepared, or its answer lost: then err wraps
// ErrUnknownOutcome); when not, the rows are unlocked and the Tx finished.
func (tx *Tx) prepareSend(ts store.TxnStore, info txnInfo, p *prepared) (held bool, err error) {
	db := tx.db
	tp := &base.TxnPrepare{Txn: info.ID, Lease: info.Lease, Index: info.Index, Primary: info.Primary, Batch: tx.prepareBatch()}
	*p = prepared{Tx: tx, TS: ts, Info: info}
	taken, err := db.pipe.prepare(tx, ts, tp)
	if err != nil && !taken {
		tx.unlockAll()
		tx.Rollback()
		return false, fmt.Errorf("txnode: prepare of transaction %x: %w", info.ID, err)
	}
	// The prepared holds the Tx now (its pins, locks and write set): its own methods are
	// done, Rollback a no-op; release comes with apply or abandon.
	tx.done = true
	if err != nil {
		return true, &prepareLostError{id: info.ID, cause: err}
	}
	return true, nil
}

// sortWrites sorts the write set by table and id (the lock order) and reindexes it.
func (tx *Tx) sortWrites() {
	sortWriteRecs(tx.writes)
	if tx.wIndex != nil {
		for i, w := range tx.writes {
			tx.wIndex[rowKey{w.t.id, w.id}] = int32(i)
		}
	}
}

// tryLockRow locks w's row if no one holds it.
func (tx *Tx) tryLockRow(w *writeRec) bool {
	_, slot := logicpage.PageOf(w.id)
	word := &frameVersions(w.m)[slot]
	for {
		v := atomic.LoadUint64(word)
		if v&versionLock != 0 {
			return false
		}
		if atomic.CompareAndSwapUint64(word, v, v|versionLock) {
			w.prev, w.locked = v, true
			return true
		}
	}
}

// prepareBatch copies the (sorted, locked) write set into a batch of its own: one segment
// per page, a fence per table at its current epoch. Owner and Seq are set by the pipeline.
func (tx *Tx) prepareBatch() *base.Batch {
	b := &base.Batch{}
	var rows []byte
	var offs []int
	for i := range tx.writes {
		w := &tx.writes[i]
		page, slot := logicpage.PageOf(w.id)
		n := len(b.Segments)
		if n == 0 || b.Segments[n-1].Table != w.t.id || b.Segments[n-1].Page != page {
			b.Segments = append(b.Segments, base.Segment{Table: w.t.id, RowBytes: uint16(w.t.rowBytes), Page: page})
			offs = append(offs, len(rows))
			if len(b.Fences) == 0 || b.Fences[len(b.Fences)-1].Table != w.t.id {
				b.Fences = append(b.Fences, base.Fence{Table: w.t.id, Epoch: w.t.epoch.Load()})
			}
			n++
		}
		s := &b.Segments[n-1]
		if w.off >= 0 {
			s.Data |= 1 << slot
			rows = append(rows, tx.buf[w.off:int(w.off)+w.t.rowBytes]...)
		} else {
			s.Clear |= 1 << slot
		}
	}
	for i := range b.Segments {
		end := len(rows)
		if i+1 < len(offs) {
			end = offs[i+1]
		}
		b.Segments[i].Rows = rows[offs[i]:end:end]
	}
	return b
}

// validate checks again that everything the prepared transaction read is unchanged (its own
// rows stay locked): a coordinator validates every part once all are prepared, so the
// reads of all its parts hold at one moment, while every write of the transaction is
// locked (serializable across storage nodes). ErrConflict when a read changed; the lease
// or grant error of a table no longer served.
func (p *prepared) validate() error {
	if p.Done {
		return ErrTxDone
	}
	if !p.Tx.validate() {
		p.Tx.db.stats.aborts.Add(1)
		return ErrConflict
	}
	return p.Tx.leasesLive()
}

// apply sends decision d to this part's storage node, retried until it answers or ctx ends,
// then finishes the part here: commit installs the rows (a new commit version) and unlocks
// them, abort unlocks them with their old values. Call it only with the decision recorded
// at the primary (or abort for a part whose prepare failed). If ctx ends first, the rows stay
// locked and the error wraps ctx's: call apply again (or abandon); the storage node's
// resolver finishes the part on its own meanwhile. If the storage node applied the other
// decision (ErrTxnDecided: a resolver's), the part is finished with that one here too and
// the error says so.
func (p *prepared) apply(ctx context.Context, d base.Decision) error {
	if p.Done {
		return ErrTxDone
	}
	if d != base.DecisionCommit && d != base.DecisionAbort {
		return fmt.Errorf("txnode: apply of decision %d", d)
	}
	err := p.TS.ApplyTxn(ctx, p.Info.ID, d)
	var other bool
	if errors.Is(err, ErrTxnDecided) {
		other, d = true, base.DecisionCommit+base.DecisionAbort-d
	} else if err != nil {
		return fmt.Errorf("txnode: apply %v to transaction %x: %w", d, p.Info.ID, err)
	}
	p.finish(d)
	if other {
		return fmt.Errorf("txnode: apply to transaction %x: the storage node applied %v: %w", p.Info.ID, decisionName(d), err)
	}
	return nil
}

// applyUncertain is apply(abort) for a coordinator that cannot tell whether the
// transaction committed (the primary answered abort after the coordinator's commit decision
// went unanswered for longer than the primary remembers forgotten decisions): it sends abort
// to this part's storage node, retried until it answers or ctx ends (the same errors as
// apply), then drops the part's rows from the cache instead of unlocking their old values,
// so their next read fetches what the storage node holds (committed or not). It returns
// base.DecisionCommit when the storage node says it applied commit (ErrTxnDecided), else
// base.DecisionNone (the storage node settled the part: aborted it, or applied and forgot it).
// Any goroutine may call it, one at a time per prepared.
func (p *prepared) applyUncertain(ctx context.Context) (base.Decision, error) {
	if p.Done {
		return base.DecisionNone, ErrTxDone
	}
	err := p.TS.ApplyTxn(ctx, p.Info.ID, base.DecisionAbort)
	got := base.DecisionNone
	if errors.Is(err, ErrTxnDecided) {
		got = base.DecisionCommit
	} else if err != nil {
		return base.DecisionNone, fmt.Errorf("txnode: apply abort (uncertain) to transaction %x: %w", p.Info.ID, err)
	}
	p.abandon()
	return got, nil
}

func decisionName(d base.Decision) string {
	if d == base.DecisionCommit {
		return "commit"
	}
	return "abort"
}

// finish installs (commit) or unlocks (abort) the part's rows and ends the Tx.
func (p *prepared) finish(d base.Decision) {
	p.Done = true
	tx := p.Tx
	if d == base.DecisionCommit {
		tx.db.pipe.installApplied(tx)
		tx.db.stats.commits.Add(1)
	} else {
		tx.unlockAll()
	}
	tx.release()
}

// abandon gives the part up without knowing its decision: its rows are unlocked and dropped
// from the cache (their next read fetches what the storage node holds, which its resolver
// settles). For a coordinator that cannot learn the decision before this DB closes; a
// local commit of such a row before the storage node settled it fails the node's commit
// pipeline (ErrTxnLocked), so only call it when the DB is closing.
func (p *prepared) abandon() {
	if p.Done {
		return
	}
	p.Done = true
	tx := p.Tx
	for i := range tx.writes {
		w := &tx.writes[i]
		_, slot := logicpage.PageOf(w.id)
		w.m.valid.And(^(uint64(1) << slot))
	}
	tx.unlockAll()
	tx.release()
}

// decideTxn records decision d of transaction id, of count participants, at this DB's
// storage node (the transaction's primary): a compare-and-set. It returns nil when d is the
// recorded decision; an error matching ErrTxnDecided when the other one is (a commit asked
// after a resolver recorded abort: the transaction aborted); any other error leaves the
// decision unknown (send the same decision again: never another one). Any goroutine may call
// it.
func (db *DB) decideTxn(ctx context.Context, id base.TxnID, lease int64, d base.Decision, count int) error {
	ts, err := db.txnStore()
	if err != nil {
		return err
	}
	if db.closed.Load() {
		return ErrClosed
	}
	_, err = ts.DecideTxn(ctx, id, lease, d, count)
	if err != nil {
		return fmt.Errorf("txnode: decide %v of transaction %x: %w", decisionName(d), id, err)
	}
	return nil
}

// applyTxn sends decision d of transaction id to this DB's storage node without a prepared:
// a coordinator aborts with it a part whose prepare it never learned the outcome of (it may
// land later: the storage node then refuses it). Idempotent.
func (db *DB) applyTxn(ctx context.Context, id base.TxnID, d base.Decision) error {
	ts, err := db.txnStore()
	if err != nil {
		return err
	}
	return ts.ApplyTxn(ctx, id, d)
}

// prepare sends tp (tx's prepare) under the owner's next seq, in seq order: the batch open
// now (which may hold earlier commits of tx's rows) is launched first; no other batch is
// launched until the storage node answered (prepHold). taken reports whether the seq may have
// been consumed (prepared, or the answer lost: then a goroutine sends it again until the
// storage node answers, and only then lets later batches go).
func (p *pipeline) prepare(tx *Tx, ts store.TxnStore, tp *base.TxnPrepare) (taken bool, err error) {
	db := p.db
	ctx := tx.ctx
	if db.opts.Durability == WriteBack {
		// Dirty rows cut before tx locked its rows must reach the store before the prepare
		// (a later epoch writing them would find them locked there).
		if err := p.flush(ctx); err != nil {
			return false, err
		}
	}
	p.mu.Lock()
	for {
		err := p.waitRoomLocked(ctx, func() bool {
			return p.admitErr() != nil || !p.prepHold && p.rec == nil && len(p.inflight) < inflightMax
		})
		if err == nil {
			err = p.admitErr()
		}
		if err == nil {
			err = droppingErr(tx)
		}
		if err != nil {
			p.mu.Unlock()
			return false, err
		}
		if p.open.nTx == 0 {
			break
		}
		b := p.open
		p.open = p.newBatchLocked()
		p.launchLocked(b) // releases mu for the send
	}
	seq := p.nextSeq
	p.nextSeq++
	p.prepHold = true
	p.mu.Unlock()
	tp.Batch.Owner, tp.Batch.Seq = db.owner, seq
	_, err = ts.PrepareTxn(ctx, tp)
	switch {
	case err == nil:
		p.endPrepare(seq, true)
		return true, nil
	case refusal(err) || p.seqGapRecovering(ctx, err, seq):
		p.endPrepare(seq, false)
		return false, err
	}
	// Not in p.bg: close may be waiting on it already (and Add must not race its Wait). The
	// goroutine ends at p.stop, or at the closed store's error.
	go p.resendPrepare(ts, tp)
	return true, err
}

// refusal reports whether err is the storage node's refusal of a prepare, which takes no seq.
func refusal(err error) bool {
	for _, e := range []error{ErrTxnLocked, ErrTxnDecided, ErrTxnBusy, ErrFenced,
		ErrTableNotFound, errMalformed, errBatchTooLarge} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// resendPrepare sends a prepare whose answer was lost again until the storage node answers
// (or the pipeline stops), then lets later batches go.
func (p *pipeline) resendPrepare(ts store.TxnStore, tp *base.TxnPrepare) {
	for {
		select {
		case <-p.stop:
			p.giveUpPrepare()
			return
		default:
		}
		if p.failure() != nil {
			return // the pipeline failed: nothing is launched any more anyway
		}
		ctx, cancel := context.WithTimeout(context.Background(), p.db.opts.RequestTimeout)
		go func() {
			select {
			case <-p.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		_, err := ts.PrepareTxn(ctx, tp)
		gap := p.seqGapRecovering(ctx, err, tp.Batch.Seq)
		cancel()
		switch {
		case err == nil:
			p.endPrepare(tp.Batch.Seq, true)
			return
		case refusal(err) || gap:
			p.endPrepare(tp.Batch.Seq, false)
			return
		case errors.Is(err, ErrClosed) || errors.Is(err, errEngineClosed):
			p.giveUpPrepare()
			return
		}
		select {
		case <-p.stop:
			p.giveUpPrepare()
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// giveUpPrepare ends the hold of a prepare whose answer will never come (closing, the store
// closed): the pipeline fails as close's abandon fails it (the seq's fate is unknown, so
// nothing may be sent after it), which wakes whatever waits for the hold: the WriteBack
// flusher's epoch waits for it on the flusher goroutine, which close waits for.
func (p *pipeline) giveUpPrepare() {
	p.mu.Lock()
	p.abandonLocked(fmt.Errorf("%w: a two-phase commit's prepare not answered", ErrClosed))
	p.mu.Unlock()
}

// endPrepare ends the hold of a prepare of seq: a seq the storage node did not take is given
// back (nothing was launched after it).
func (p *pipeline) endPrepare(seq uint64, taken bool) {
	p.mu.Lock()
	if !taken && p.nextSeq == seq+1 {
		p.nextSeq = seq
	}
	p.prepHold = false
	p.room.Broadcast()
	open := p.open.nTx > 0
	p.mu.Unlock()
	if open {
		p.kickNow()
	}
}

// installApplied installs a committed part's rows (applied at the storage node) under a new
// commit version. Durable: the version is folded into the batch that will be acknowledged
// next (the open one, else the last in flight), or made durable at once when none is: the
// rows are durable already, and durableVer must not pass a batch still in flight.
// WriteBack: taken and installed under the cut's read lock, as a commit's (the rows are
// marked dirty too, and sent again in the next epoch: the same bytes).
func (p *pipeline) installApplied(tx *Tx) {
	db := p.db
	if db.opts.Durability == WriteBack {
		p.wbMu.RLock()
		tx.installRows(db.commitVer.Add(1), true)
		p.wbMu.RUnlock()
		return
	}
	p.mu.Lock()
	ver := db.commitVer.Add(1)
	switch {
	case p.rec != nil:
		// Recovering (recover.go): the batches in flight fail, so folding the version
		// into one would fail a part the storage node applied. The recovery makes it
		// durable when it ends (nothing is in flight then); its install is counted, so
		// the recovery ends after it.
		p.rec.applied = max(p.rec.applied, ver)
		p.installing.Add(1)
		p.mu.Unlock()
		tx.install(ver)
		p.installDone()
		return
	case p.open.nTx > 0:
		p.open.lastVer = ver
	case len(p.inflight) > 0:
		last := p.inflight[len(p.inflight)-1]
		last.lastVer = max(last.lastVer, ver)
		appendFrames(last, tx)
	default:
		db.advanceDurable(ver)
		p.settleLocked(ver)
	}
	if p.open.nTx > 0 {
		appendFrames(p.open, tx)
	}
	// Counted: a recovery from the batch it joined (recover.go) waits for the install, then
	// invalidates its frames (their rows, applied at the store, are fetched again).
	p.installing.Add(1)
	p.mu.Unlock()
	tx.install(ver)
	p.installDone()
}

// appendFrames adds the frames tx writes to b's, so that b's failure invalidates them too.
// Caller holds mu.
func appendFrames(b *batch, tx *Tx) {
	var last *frameMeta
	for i := range tx.writes {
		if m := tx.writes[i].m; m != last {
			b.frames = append(b.frames, refOf(m))
			last = m
		}
	}
}

// validateLive checks that everything the transaction read is unchanged and its tables
// still served, without ending it: ErrConflict, or the lease or grant error. A coordinator
// calls it on a part whose closure failed, to tell a conflict (retry) from the closure's own
// error (txncoord.Validate).
func (tx *Tx) validateLive() error {
	if tx.done {
		return ErrTxDone
	}
	if !tx.validate() {
		return ErrConflict
	}
	return tx.leasesLive()
}
