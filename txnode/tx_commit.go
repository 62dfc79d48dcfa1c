package txnode

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/weftdb/weft/logicpage"
)

// A transaction's commit: its write set locked in (table, id) order, what it read validated
// (Silo's rule, insert epochs included), its rows handed to the pipeline and installed; then
// the wait for its batch's answer (commitWait).

// Commit commits the transaction: it returns nil once the transaction is durable (Durable) or
// installed (WriteBack), ErrConflict if a concurrent commit changed what it read, or the
// store's error. The Tx is finished either way.
func (tx *Tx) Commit() error {
	if tx.done {
		return ErrTxDone
	}
	db, ctx := tx.db, tx.ctx
	p, err := tx.commit()
	tx.release()
	if err != nil {
		return err
	}
	return p.wait(db, ctx)
}

// abort rolls back a transaction whose closure returned err, and returns err, or ErrConflict
// (for the retry loop) when a concurrent commit changed what the transaction read: optimistic
// reads are no snapshot, so err may come from seeing the state both before and after it.
func (tx *Tx) abort(err error) error {
	if !tx.validate() {
		tx.db.stats.aborts.Add(1)
		err = ErrConflict
	} else if lerr := tx.leasesLive(); lerr != nil {
		// The closure's reads are checked against the lease once per table: an error it
		// decided on reads made after the lease ran out is not returned as if it stood.
		err = lerr
	}
	tx.Rollback()
	return err
}

// waitReads waits, in Durable mode, until every row the transaction read so far is durable
// (DB.Update does so before it returns its closure's own error, which may rest on a commit
// not yet durable: a balance found too low). It returns nil once they are (at once in
// WriteBack, or when nothing read is pending); ErrConflict when a batch holding one of them
// failed (what was read never happened: run the transaction again); the context's error if
// it ends first. The transaction stays open: Rollback it after. For a Tx from Begin, on its
// goroutine.
func (tx *Tx) waitReads() error {
	if tx.done {
		return ErrTxDone
	}
	db := tx.db
	if err := (commitWait{ver: tx.maxRead}).wait(db, tx.ctx); err != nil {
		if db.readFailed(err) {
			return fmt.Errorf("%w: a commit batch holding a row read failed: %w", ErrConflict, err)
		}
		return err
	}
	return nil
}

// commitWait describes what a committed transaction still waits for to be durable. Batches
// are acknowledged in order, so that is the node's durable version reaching ver.
type commitWait struct {
	ver   uint64 // the commit version, or the highest version read (read-only)
	write bool   // a write: an ended context leaves its outcome unknown
	// readVer (a write) is the highest version its transaction read: see heldVers.answer.
	readVer uint64
	// after (not a write): a Session's Pending, which resolves no earlier than the session's
	// write before it, held or not (DB.waitOrdered).
	after bool
	// ordered: a Session's Pending (or Flush), which resolves in the session's order. Its
	// version failing (a refused batch's range, recover.go, or a failed batch before it)
	// says nothing of the batches before it, which may still be out: it first waits until
	// they are back (waitSettled).
	ordered bool
	// start (a write) is when its commit began: its answer's latency (Stats.CommitP99).
	start time.Time
}

// wait returns once the transaction is durable in Durable mode; in WriteBack at once.
func (p commitWait) wait(db *DB, ctx context.Context) error {
	if db.opts.Durability == WriteBack {
		return nil
	}
	return p.waitDurable(db, ctx)
}

// waitDurable returns once the transaction is durable, in either mode, and records a
// write's commit latency whichever way the answer came (already durable, or after a wait).
func (p commitWait) waitDurable(db *DB, ctx context.Context) error {
	err := p.waitAnswer(db, ctx)
	if err == nil && p.write && !p.start.IsZero() {
		db.stats.commitLat.Since(p.start)
	}
	return err
}

// waitAnswer is waitDurable's wait for the answer.
func (p commitWait) waitAnswer(db *DB, ctx context.Context) error {
	if p.ver <= db.durableVer.Load() {
		// Loaded after durableVer: a recovery records its failed range before durableVer
		// passes it, and a committer of the range may reach its wait late (recover.go).
		// A write's batch may be held (recover.go): then waitCommitted waits for its answer.
		if err := db.verFailed(p.ver); err == nil || !p.write && !p.after {
			return err
		}
	}
	var err error
	switch {
	case p.write:
		err = db.waitCommitted(ctx, p.ver, p.readVer)
	case p.after:
		err = db.waitOrdered(ctx, p.ver)
	default:
		err = db.waitDurable(ctx, p.ver)
	}
	if err != nil && p.ordered && db.opts.Durability == Durable && db.cache.settledVer.Load() < p.ver {
		// Failed (a refused batch's range, or the pipeline for good) while batches before
		// it may still be out: wait until every batch holding a version up to ver is back,
		// so the session's earlier pendings are resolved first. (A non-context error: Close
		// gave up on them; each has its own answer.)
		if serr := db.pipe.waitSettled(ctx, p.ver); serr != nil && serr == ctx.Err() {
			err = serr
		}
	}
	if err != nil && p.write && (err == ctx.Err() || errors.Is(err, ErrUnavailable)) {
		// Sent (or queued to be), and kept for a resend on reconnect: it may yet apply.
		return fmt.Errorf("%w: %w", ErrUnknownOutcome, err)
	}
	return err
}

// commit validates and installs; the returned commitWait says what to wait for.
func (tx *Tx) commit() (commitWait, error) {
	db := tx.db
	if tx.busy.t != nil {
		return commitWait{}, errCacheBusy
	}
	if len(tx.writes) == 0 {
		if err := tx.leasesLive(); err != nil {
			return commitWait{}, err
		}
		if !tx.validate() {
			db.stats.aborts.Add(1)
			return commitWait{}, ErrConflict
		}
		if db.failHi.Load() != 0 {
			// A read of a version a refused batch held (recover.go). One published later
			// holds maxRead, or a version given after it, which this check then sees.
			if err := tx.readFailed(); err != nil {
				return commitWait{}, err
			}
		}
		return commitWait{ver: tx.maxRead}, nil
	}
	start := time.Now()
	tx.sortWrites()
	// The lease once per table touched, read on the clock now: the tables written and the
	// tables only read (reads of a table whose lease ran out since its first touch came from
	// a cache another owner may have outdated; validation cannot see that).
	if err := tx.leasesLive(); err != nil {
		return commitWait{}, err
	}
	for i := range tx.writes {
		if err := tx.lockRow(&tx.writes[i]); err != nil {
			tx.unlockAll()
			return commitWait{}, err
		}
	}
	// Silo's insert rule: with the write set locked and before validation, bump the insert
	// epoch of every table this transaction inserts into. A scan or Get that found no row
	// (past idHigh, or in a range of this node's grants) recorded the epoch; if it validates
	// after this bump it fails, and if it validated before, it is serialized before this
	// transaction (it held its own write set locked while validating). Bumping at install,
	// after validation and after add may have waited, left a gap in which two "insert if
	// absent" transactions both committed.
	//
	// A transaction that recorded the epoch it bumps bumps it only from that value (CAS):
	// if another inserter bumped it meanwhile this one fails validation anyway, and a bump
	// of its own would fail the other too. Two "insert if absent" transactions that bumped
	// each other's epoch both aborted, and under contention kept doing so (a livelock).
	if err := tx.bumpInserts(); err != nil {
		return commitWait{}, err
	}
	if !tx.validate() {
		tx.unlockAll()
		db.stats.aborts.Add(1)
		return commitWait{}, ErrConflict
	}
	ver, err := db.pipe.add(tx)
	if err != nil {
		tx.unlockAll()
		return commitWait{}, err
	}
	if db.testHookAdded != nil {
		db.testHookAdded(tx)
	}
	tx.install(ver)
	db.pipe.addDone()
	db.stats.commits.Add(1)
	return commitWait{ver: ver, write: true, readVer: tx.maxRead, start: start}, nil
}

// lockRow locks w's row. A row locked by another committer (who may wait in the pipeline's
// add for acknowledgements) is waited for parked, for as long as tx's context allows: then
// the commit fails with the context's error, nothing applied.
func (tx *Tx) lockRow(w *writeRec) error {
	_, slot := logicpage.PageOf(w.id)
	versions := frameVersions(w.m)
	word := &versions[slot]
	for {
		v := atomic.LoadUint64(word)
		if v&versionLock == 0 {
			if atomic.CompareAndSwapUint64(word, v, v|versionLock) {
				w.prev, w.locked = v, true
				return nil
			}
			continue
		}
		if err := tx.db.cache.rows.wait(tx.ctx, w.m, slot, word); err != nil {
			return err
		}
	}
}

func (tx *Tx) unlockAll() {
	for i := range tx.writes {
		w := &tx.writes[i]
		if w.locked {
			_, slot := logicpage.PageOf(w.id)
			versions := frameVersions(w.m)
			atomic.StoreUint64(&versions[slot], w.prev)
			tx.db.cache.rows.wake(w.m, slot)
			w.locked = false
		}
	}
}

// validate checks that everything read is unchanged (and not locked by another committer).
func (tx *Tx) validate() bool {
	for _, r := range tx.reads {
		versions := frameVersions(r.m)
		cur := atomic.LoadUint64(&versions[r.slot])
		if cur&^versionLock != r.ver {
			return false
		}
		if cur&versionLock != 0 && !tx.lockedByMe(r.m, r.slot) {
			return false
		}
	}
	for _, p := range tx.pageReads {
		if p.m.pageVer.Load() != p.ver {
			return false
		}
	}
	for _, r := range tx.insReads {
		cur := r.t.insertEpoch.Load()
		for _, t := range tx.bumped {
			if t == r.t {
				cur-- // our own bump (writes are sorted by table: at most one per table)
			}
		}
		if cur != r.epoch {
			return false
		}
	}
	// Last, after every version: a table superseded now was not when they were read here
	// (its successor is published only after the mark), so no write they miss was made.
	for _, t := range tx.leased {
		if t.superseded.Load() {
			return false
		}
	}
	return true
}

// insEpochRead returns the insert epoch of t this transaction recorded (the last, if it
// recorded several: if they differ, validation fails anyway).
func (tx *Tx) insEpochRead(t *tableState) (uint64, bool) {
	for i := len(tx.insReads) - 1; i >= 0; i-- {
		if tx.insReads[i].t == t {
			return tx.insReads[i].epoch, true
		}
	}
	return 0, false
}

func (tx *Tx) lockedByMe(m *frameMeta, slot uint8) bool {
	key := m.key.Load()
	id := logicpage.RowID(key&(1<<32-1), int(slot))
	i := tx.findWrite(uint32(key>>32), id)
	return i >= 0 && tx.writes[i].locked
}

// install writes the rows into the cache with version ver and unlocks them.
func (tx *Tx) install(ver uint64) { tx.installRows(ver, false) }

// installRows is install; applied says the rows are applied at the storage node already (a
// committed two-phase part): in WriteBack they are marked dirty (sent again in the next
// epoch: the same bytes), but not in a table whose writes are held (hold.go), whose source
// may be frozen for a move by the time of that epoch: it would refuse it, and fail the
// pipeline with every other table's acknowledged writes.
func (tx *Tx) installRows(ver uint64, applied bool) {
	wb := tx.db.opts.Durability == WriteBack
	for i := range tx.writes {
		w := &tx.writes[i]
		_, slot := logicpage.PageOf(w.id)
		bit := uint64(1) << slot
		r := w.t.rowBytes
		versions, rows := frameWords(w.m, r)
		dst := rows[slot*r : (slot+1)*r]
		wasPresent := w.m.present.Load()&bit != 0
		if w.off >= 0 {
			logicpage.StoreRow(dst, tx.buf[w.off:int(w.off)+r])
			if !wasPresent {
				w.m.present.Or(bit)
				w.m.pageVer.Store(ver)
			}
		} else {
			zeroRow(dst)
			if wasPresent {
				w.m.present.And(^bit)
				w.m.pageVer.Store(ver)
			}
		}
		w.m.valid.Or(bit)
		if wb && !(applied && w.t.held.Load()) {
			old := w.m.dirty.Or(bit)
			if old == 0 {
				tx.db.pipe.noteDirty(w.m)
			}
			if old&bit == 0 {
				tx.db.pipe.dirtyRows.Add(1)
				tx.db.pipe.dirtyRowBytes.Add(int64(w.t.rowBytes))
			}
		}
		atomic.StoreUint64(&versions[slot], ver)
		tx.db.cache.rows.wake(w.m, slot)
		w.locked = false
	}
}

// sortWriteRecs sorts a write set by table and id: the order rows are locked in.
func sortWriteRecs(ws []writeRec) {
	slices.SortFunc(ws, func(a, b writeRec) int {
		if a.t.id != b.t.id {
			return int(a.t.id) - int(b.t.id)
		}
		switch {
		case a.id < b.id:
			return -1
		case a.id > b.id:
			return 1
		}
		return 0
	})
}

// bumpInserts applies Silo's insert rule (see commit) with the write set locked: on
// ErrConflict the rows are unlocked again.
func (tx *Tx) bumpInserts() error {
	db := tx.db
	for i := range tx.writes {
		w := &tx.writes[i]
		if w.insert && (len(tx.bumped) == 0 || tx.bumped[len(tx.bumped)-1] != w.t) {
			if e, ok := tx.insEpochRead(w.t); ok {
				if !w.t.insertEpoch.CompareAndSwap(e, e+1) {
					tx.unlockAll()
					db.stats.aborts.Add(1)
					return ErrConflict
				}
			} else {
				w.t.insertEpoch.Add(1)
			}
			tx.bumped = append(tx.bumped, w.t)
		}
	}
	if db.testHookBumped != nil && len(tx.bumped) > 0 {
		db.testHookBumped(tx)
	}
	return nil
}
