package storenode

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/logicpage"
	"github.com/weftdb/weft/storenode/wal"
)

// The replica side of a replicated store (docs/replication.md, 1.1; stage R2a). With
// Options.Proposer set, a request is checked on the leader under mu, against the applied state
// plus the pending overlay, and its record is proposed instead of appended to the WAL; nothing
// of it is applied then. Every replica, the leader included, applies the committed entries in
// log order through ApplyCommitted, which rechecks them against the applied state only and
// answers the proposal's caller on the leader.
//
//	leader:  check under mu ──▶ Proposer.Propose(kind, pieces, force, id)
//	all:     ApplyCommitted(index, id, kind, payload) under mu: recheck, apply, lastLSN = index
//	         ──▶ the proposal's waiter (its caller's done, as a WAL acknowledgement today)
//
// Invariants:
//   - the engine's LSN is the log index: lastLSN, dedup entries, writeLSN and acknowledgements
//     are indexes; durableLSN follows the applied index (an applied entry is committed).
//   - the outcome of an entry is decided at apply, by the applied state alone, so every
//     replica decides alike: a commit's dedup (a seq applied is answered from its window,
//     never applied twice), its fences (a stale owner's epoch is refused), its seq order
//     (seq == lastSeq+1, else ErrSeqGap); a create of a name or an id taken is refused; an
//     ownership grant not above the table's epoch is refused.
//   - the pending overlay (replState) is leader soft state: per owner the highest seq proposed
//     and not applied, and the table ids, id high-water marks and epochs proposed. It only
//     orders proposals; ProposalsLost (leadership lost) clears it.
//   - what is not replicated yet fails with ErrNotReplicated under a Proposer (appendPieces;
//     MoveActivate and MoveWrite before any change: move.go). Move steps are (move_repl.go). A replica's checkpoint carries nothing in the log:
//     it writes its transaction and move states to its sidecar (txnstate.go).
//   - a replica expires no owner on its own clock: the leader's checkpoint proposes the
//     expiry (proposeExpiry, kindExpired) and every replica applies it.
//
// Deviations from the design's table (docs/replication.md, 5): ApplyCommitted takes the entry's
// proposal id (the envelope's `proposal`, 1.4) to find the waiter; Propose takes the WAL's
// gather list (wal.Piece, as appendPieces), its kept pieces valid until the outcome.

// Proposer hands a replicated engine's records to the group's log (repl.Node; an in-memory one
// in the tests). Its methods are called with the engine's mu held: they must not call back into
// the engine, and must not block but for backpressure (a bounded queue, as the WAL's). Lease is
// also called with no lock of the engine held, from an event loop (RenewGrant): it never
// blocks.
type Proposer interface {
	// Propose appends record (kind, p) under proposal id to the log, or returns an error and
	// proposes nothing (ErrNotLeader: this replica does not lead). It copies the pieces
	// without Keep before it returns; the kept ones stay valid until the proposal's entry is
	// applied (ApplyCommitted with id) or the proposal is given up (ProposalsLost). force:
	// synced on a majority in every sync mode.
	Propose(kind byte, p []wal.Piece, force bool, id uint64) error
	// Lease reports until when (unix nanoseconds of the engine clock) this replica leads
	// under its leader lease (docs/replication.md, 2.2), ok false when it does not lead. A
	// replica that does not lead refuses requests with ErrNotLeader before any check (until
	// is not consulted yet: reads under the lease come with stage R4).
	Lease() (until int64, ok bool)
}

// replState is the leader's pending overlay and the waiting proposals. Guarded by Engine.mu.
type replState struct {
	lastID  uint64               // the last proposal id handed out (random start: ids of replicas differ)
	waiting map[uint64]*proposal // by id: proposed, outcome not known yet
	seqs    map[uint64]pendSeq   // by owner: commits proposed, not applied
	table   uint32               // one past the highest table id proposed (0: none)
	nextIDs map[uint32]uint64    // by table: id high-water mark proposed
	epochs  map[uint32]uint64    // by table: epoch proposed
	// expiring: an expiry record (kindExpired) of this leader waits for its apply; the next
	// checkpoint proposes none (the owners it names would be named again).
	expiring bool
	// expiringTxns: a decision expiry record (kindTxnExpired) of this leader waits for its
	// apply; the next sweep proposes none.
	expiringTxns bool
	// txnStates are the indexes of the transaction state sidecars in the directory this
	// engine knows of: the one its meta file names and any written since (txnstate.go).
	// Guarded by ckptMu (Open: the engine is not shared yet).
	txnStates []uint64
}

// pendSeq is an owner's commits waiting: the highest seq proposed and how many wait.
type pendSeq struct {
	seq uint64
	n   int
}

// proposal is one proposed record waiting for its outcome.
type proposal struct {
	kind byte
	// owner of a commit (its pendSeq counts it).
	owner uint64
	// done gets the outcome: the index that applied the record (for a commit answered from
	// the dedup window, the index of the batch it repeats), or the error that refused it.
	// It runs with mu released, on the goroutine that called ApplyCommitted or ProposalsLost.
	done func(index uint64, err error)
}

// replicated reports whether the engine is a replica (Options.Proposer set).
func (e *Engine) replicated() bool { return e.opts.Proposer != nil }

// checkLeader refuses a request with ErrNotLeader on a replica that does not lead (nil when
// standalone). Caller holds mu.
func (e *Engine) checkLeader() error {
	if e.opts.Proposer == nil {
		return nil
	}
	if _, ok := e.opts.Proposer.Lease(); !ok {
		return ErrNotLeader
	}
	return nil
}

// propose hands record (kind, p) to the Proposer under a new id with w as its waiter. Caller
// holds mu. On error nothing was proposed and w will not be called.
func (e *Engine) propose(kind byte, p []wal.Piece, force bool, w *proposal) error {
	r := &e.repl
	if r.waiting == nil {
		r.waiting = make(map[uint64]*proposal)
		r.lastID = rand.Uint64() >> 1
	}
	r.lastID++
	if r.lastID == 0 {
		r.lastID = 1 // 0 is "not proposed here"
	}
	id := r.lastID
	w.kind = kind
	r.waiting[id] = w
	if err := e.opts.Proposer.Propose(kind, p, force, id); err != nil {
		delete(r.waiting, id)
		return fmt.Errorf("storenode: propose record of kind %d: %w", kind, err)
	}
	return nil
}

// proposeRecord proposes a one-piece record and waits for its outcome, mu released meanwhile.
// Caller holds mu; it is held again on return.
func (e *Engine) proposeRecord(kind byte, payload []byte) error {
	ch := make(chan error, 1)
	e.onePiece[0] = wal.Piece{Bytes: payload}
	err := e.propose(kind, e.onePiece[:], true, &proposal{done: func(_ uint64, err error) { ch <- err }})
	e.onePiece[0] = wal.Piece{}
	if err != nil {
		return err
	}
	e.mu.Unlock()
	err = <-ch
	e.mu.Lock()
	return err
}

// ProposalsLost ends the wait of every proposal this replica made that was not applied yet:
// their callers get cause wrapped in ErrUnknownOutcome (an entry may still commit: a retry is
// answered by the dedup window), and the pending overlay is cleared. The Proposer calls it when
// its replica stops leading, with nothing of the engine's held. An entry of such a proposal
// that commits later is applied as any other; its outcome goes nowhere.
func (e *Engine) ProposalsLost(cause error) {
	e.mu.Lock()
	waiting := e.dropProposals()
	e.cond.Broadcast()
	e.mu.Unlock()
	err := fmt.Errorf("%w: proposal given up: %w", ErrUnknownOutcome, cause)
	for _, w := range waiting {
		w.done(0, err)
	}
}

// dropProposals empties the waiting proposals and the overlay and returns the waiters. Caller
// holds mu.
func (e *Engine) dropProposals() []*proposal {
	r := &e.repl
	out := make([]*proposal, 0, len(r.waiting))
	for _, w := range r.waiting {
		out = append(out, w)
	}
	clear(r.waiting)
	clear(r.seqs)
	clear(r.nextIDs)
	clear(r.epochs)
	r.table = 0
	r.expiring, r.expiringTxns = false, false
	return out
}

// ApplyCommitted applies the committed log entry at index, proposed under id (0 or an id not
// proposed here: another replica's), and answers its proposal if this replica made it. Entries
// come one at a time, in log order, index above every index applied. It returns an error only
// when the entry cannot be applied at all (a payload that does not decode, a file that cannot
// be created): the engine is then failed (ErrFailStop) and its proposals are answered with it.
// A refusal decided at apply (fenced, seq gap, name taken) is the proposal's outcome, not an
// error of ApplyCommitted. One goroutine at a time (the group's apply goroutine).
func (e *Engine) ApplyCommitted(index, id uint64, kind byte, payload []byte) error {
	e.mu.Lock()
	if !e.replicated() {
		e.mu.Unlock()
		return errors.New("storenode: ApplyCommitted on an engine without a Proposer")
	}
	if err := e.usable(); err != nil {
		e.mu.Unlock()
		return err
	}
	if index <= e.lastLSN {
		e.mu.Unlock()
		return fmt.Errorf("storenode: apply entry %d: entries through %d are applied", index, e.lastLSN)
	}
	w := e.repl.waiting[id]
	delete(e.repl.waiting, id)
	at, outcome, err := e.applyEntry(kind, payload, index)
	if err != nil {
		err = e.fail(fmt.Errorf("storenode: apply entry %d (kind %d): %w", index, kind, err))
		waiting := e.dropProposals()
		e.cond.Broadcast()
		e.mu.Unlock()
		e.failDurable(err)
		if w != nil {
			waiting = append(waiting, w)
		}
		for _, w := range waiting {
			w.done(0, err)
		}
		return err
	}
	e.lastLSN = index
	if w != nil && (w.kind == kindCommit || w.kind == kindTxnPrepare) {
		e.commitSettled(w.owner)
	}
	if w != nil && w.kind == kindExpired {
		e.repl.expiring = false
	}
	if w != nil && w.kind == kindTxnExpired {
		e.repl.expiringTxns = false
	}
	e.cond.Broadcast() // seqs advanced, gaps closed
	if kind == kindCommit && e.cachePressure() {
		e.requestCheckpoint()
	}
	e.mu.Unlock()
	e.acknowledged(index)
	if w != nil {
		w.done(at, outcome)
	}
	return nil
}

// commitSettled counts off one waiting commit of owner from the overlay. Caller holds mu.
func (e *Engine) commitSettled(owner uint64) {
	ps, ok := e.repl.seqs[owner]
	if !ok {
		return
	}
	if ps.n <= 1 {
		delete(e.repl.seqs, owner)
		return
	}
	e.repl.seqs[owner] = pendSeq{seq: ps.seq, n: ps.n - 1}
}

// applyEntry applies one committed entry at index: it returns the index to answer its
// proposal with and the refusal decided at apply (outcome), or the error that fails the
// engine. Caller holds mu; it may wait with mu released for a checkpoint to make room.
func (e *Engine) applyEntry(kind byte, payload []byte, index uint64) (at uint64, outcome, err error) {
	switch kind {
	case kindCommit:
		return e.applyCommitEntry(payload, index)
	case kindCreateTable, kindCreateClusterTable:
		var (
			id   uint32
			name string
			err  error
		)
		if kind == kindCreateTable {
			id, _, name, err = decodeCreateRecord(payload)
		} else {
			id, _, name, _, err = decodeCreateClusterRecord(payload)
		}
		if err != nil {
			return 0, nil, err
		}
		if _, ok := e.byName[name]; ok {
			return 0, fmt.Errorf("%w: %q", ErrTableExists, name), nil
		}
		if id < e.nextTable {
			// Two creates proposed before either applied took one id: the later is refused.
			return 0, fmt.Errorf("%w: table id %d taken by a create applied first (next id %d)", ErrTableExists, id, e.nextTable), nil
		}
		if err := e.applyRecord(kind, payload, index); err != nil {
			return 0, nil, err
		}
		if e.repl.table <= e.nextTable {
			e.repl.table = 0
		}
		return index, nil, nil
	case kindGrantIDs:
		id, _, err := decodeGrantIDsRecord(payload)
		if err != nil {
			return 0, nil, err
		}
		if _, ok := e.tables[id]; !ok {
			// Dropped by an entry applied first.
			return 0, fmt.Errorf("%w: id %d", ErrTableNotFound, id), nil
		}
		if err := e.moveRefuses(e.tables[id]); err != nil {
			// A move step applied first (proposed before this grant): the overlay forgets
			// the grant unless a later one is proposed.
			if _, next, _ := decodeGrantIDsRecord(payload); e.repl.nextIDs[id] <= next {
				delete(e.repl.nextIDs, id)
			}
			return 0, err, nil
		}
		if err := e.applyRecord(kind, payload, index); err != nil {
			return 0, nil, err
		}
		if id, _, _ := decodeGrantIDsRecord(payload); e.repl.nextIDs[id] <= e.tables[id].nextID {
			delete(e.repl.nextIDs, id)
		}
		return index, nil, nil
	case kindGrantOwner:
		id, _, epoch, err := decodeGrantOwnerRecord(payload)
		if err != nil {
			return 0, nil, err
		}
		t, ok := e.tables[id]
		if !ok {
			// Dropped by an entry applied first.
			return 0, fmt.Errorf("%w: id %d", ErrTableNotFound, id), nil
		}
		if epoch <= t.epoch {
			return 0, fmt.Errorf("%w: table %q: the grant of epoch %d was overtaken by another", ErrTableOwned, t.name, epoch), nil
		}
		if err := e.moveRefuses(t); err != nil {
			// A move step applied first (proposed before this grant): the overlay forgets
			// the grant unless a later one is proposed.
			if e.repl.epochs[id] <= epoch {
				delete(e.repl.epochs, id)
			}
			return 0, err, nil
		}
		if err := e.applyRecord(kind, payload, index); err != nil {
			return 0, nil, err
		}
		if e.repl.epochs[id] <= epoch {
			delete(e.repl.epochs, id)
		}
		if t.cluster.IsCluster() {
			t.grantLSN = index // a renewal is answered once it is applied here (registerCheck)
		}
		return index, nil, nil
	case kindTxnPrepare:
		return e.applyPrepareEntry(payload, index) // txn_repl.go
	case kindTxnDecide:
		return e.applyDecideEntry(payload, index)
	case kindTxnApply:
		return e.applyApplyEntry(payload, index)
	case kindTxnReported:
		return e.applyReportedEntry(payload, index)
	case kindTxnForgot:
		if err := decodeTxnForgotRecord(payload, e.applyForgot); err != nil {
			return 0, nil, err
		}
		return index, nil, nil
	case kindTxnExpired:
		if err := decodeTxnExpiredRecord(payload, e.applyTxnExpired); err != nil {
			return 0, nil, err
		}
		return index, nil, nil
	case kindExpired:
		if err := e.applyRecord(kind, payload, index); err != nil {
			return 0, nil, err
		}
		return index, nil, nil
	case kindMoveState:
		return e.applyMoveStepEntry(payload, index) // move_repl.go
	case kindDropTable:
		id, err := decodeDropRecord(payload)
		if err != nil {
			return 0, nil, err
		}
		t, ok := e.tables[id]
		if !ok {
			// Two drops proposed before either applied: the later is refused.
			return 0, fmt.Errorf("%w: id %d", ErrTableNotFound, id), nil
		}
		if e.tableLocked(id) {
			// A prepare applied between the leader's check and the drop.
			return 0, fmt.Errorf("%w: table %q has rows of a prepared transaction", ErrTxnLocked, t.name), nil
		}
		if err := e.applyRecord(kind, payload, index); err != nil {
			return 0, nil, err
		}
		delete(e.repl.nextIDs, id)
		delete(e.repl.epochs, id)
		return index, nil, nil
	}
	return 0, nil, fmt.Errorf("%w: record kind %d", ErrNotReplicated, kind)
}

// applyCommitEntry applies a committed commit record at index, decided on the applied state
// alone: a seq the owner applied is answered from its window (never applied twice); a batch
// whose fences or locks do not hold, or whose seq is not the owner's next, is refused. Caller
// holds mu.
func (e *Engine) applyCommitEntry(payload []byte, index uint64) (uint64, error, error) {
	var c commitRecord
	if err := decodeCommitRecord(payload, &c); err != nil {
		return 0, nil, err
	}
	if c.owner == 0 || c.owner == MoveWriter || c.seq == 0 {
		return 0, nil, corrupt.Errorf("storenode: apply entry %d: commit of owner %d seq %d", index, c.owner, c.seq)
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
	if err := e.checkTxnLocks(b.Segments); err != nil {
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
	for {
		room, err := e.reserveFrames(b)
		if err != nil {
			return 0, err, nil
		}
		if room {
			break
		}
		// Full of dirty pages: wait for a checkpoint to clean some, as commit does.
		gen := e.ckptGen
		e.trig.stalled = true
		e.requestCheckpoint()
		for e.ckptGen == gen && e.usable() == nil {
			e.cond.Wait()
		}
		if err := e.usable(); err != nil {
			return 0, nil, err
		}
	}
	e.applyCommitBatch(b, c.hash, index)
	e.stats.commits.Add(1)
	return index, nil, nil
}

// commitProposed is commit under a Proposer, from its dedup check on, mu held: the batch is
// checked against the applied state plus the overlay (an owner's pipelined batches propose in
// seq order without waiting for apply; a gap waits, at most Options.SeqGapWait) and proposed;
// done gets the outcome at apply. A seq proposed and not applied yet (a resend) is proposed
// again: the apply of the second answers from the dedup window.
func (e *Engine) commitProposed(b *base.Batch, hash uint64, done func(uint64, error)) error {
	var gapDeadline time.Time
	for {
		if e.closed {
			return ErrClosed
		}
		if err := e.checkLeader(); err != nil {
			return err // also for a gap waiter whose replica stopped leading
		}
		o := e.owners[b.Owner]
		if o != nil && b.Seq <= o.lastSeq {
			lsn, err := o.retried(b, hash)
			if err != nil {
				return err
			}
			e.stats.retried.Add(1)
			e.mu.Unlock()
			e.ackWhenDurable(lsn, done) // applied is committed: at once
			e.mu.Lock()
			return nil
		}
		if err := e.failure(); err != nil {
			return err
		}
		if err := e.admitChecks(b, o); err != nil {
			return err
		}
		ps, pending := e.repl.seqs[b.Owner]
		last, known := ps.seq, pending
		if o != nil {
			last, known = max(last, o.lastSeq), true
		}
		// An owner with nothing applied or proposed starts at any seq, as in commit.
		if !known || b.Seq <= last+1 {
			break
		}
		if o != nil {
			if err := o.refusedGap(b.Seq); err != nil {
				return err
			}
		}
		if gapDeadline.IsZero() {
			gapDeadline = time.Now().Add(e.opts.SeqGapWait)
			timer := time.AfterFunc(e.opts.SeqGapWait, e.wake)
			defer timer.Stop()
		}
		if !time.Now().Before(gapDeadline) {
			return fmt.Errorf("%w: batch seq %d, last applied or proposed %d", ErrSeqGap, b.Seq, last)
		}
		e.gapWaiters++
		e.cond.Wait()
		e.gapWaiters--
	}
	err := e.propose(kindCommit, e.commitPieces(b, hash), false, &proposal{owner: b.Owner, done: done})
	clear(e.pieces)
	if err != nil {
		return err
	}
	if e.repl.seqs == nil {
		e.repl.seqs = make(map[uint64]pendSeq)
	}
	ps := e.repl.seqs[b.Owner]
	e.repl.seqs[b.Owner] = pendSeq{seq: max(ps.seq, b.Seq), n: ps.n + 1}
	return nil
}

// createTableProposed is createTable under a Proposer, after its checks, mu held: the id is
// the next past the applied and the proposed creates; the data file is made at apply.
func (e *Engine) createTableProposed(name string, rowBytes int, cl base.ClusterLayout, owner uint64, as bool) (base.TableInfo, error) {
	id := max(e.nextTable, e.repl.table)
	if id == tableIDNone {
		return base.TableInfo{}, fmt.Errorf("%w: every table id has been used", ErrTooManyTables)
	}
	kind := kindCreateTable
	e.scratch = appendCreateRecord(e.scratch[:0], id, rowBytes, name)
	if cl.IsCluster() {
		kind = kindCreateClusterTable
		e.scratch = appendCreateClusterRecord(e.scratch[:0], id, rowBytes, name, cl)
	}
	payload := e.scratch
	e.repl.table = id + 1 // before the wait: a create proposed meanwhile takes the next id
	if err := e.proposeRecord(kind, payload); err != nil {
		return base.TableInfo{}, err
	}
	t, ok := e.tables[id]
	if !ok || t.name != name {
		return base.TableInfo{}, fmt.Errorf("%w: table %q was dropped before its creation returned", ErrTableNotFound, name)
	}
	t.creator, t.createdAs = owner, as
	return t.info(), nil
}

// proposeExpiry is expireOwners on a replica, mu held: the leader decides on its clock which
// owners expire and proposes them (kindExpired, with each one's last applied seq); every
// replica drops them at the entry's apply, rechecked there (applyExpired). A follower, or a
// leader whose last expiry waits for its apply, proposes nothing. Nobody waits for the
// outcome: an expiry lost with a leadership is decided again by the next leader.
func (e *Engine) proposeExpiry() {
	if e.repl.expiring || e.checkLeader() != nil {
		return
	}
	var owners []expiredOwner
	e.idleOwners(func(id uint64, o *ownerState) bool {
		if _, ok := e.repl.seqs[id]; ok {
			return true // batches proposed: not idle
		}
		owners = append(owners, expiredOwner{owner: id, seq: o.lastSeq})
		return len(owners) < expiredOwnersMax
	})
	if len(owners) == 0 {
		return
	}
	slices.SortFunc(owners, func(a, b expiredOwner) int { return cmp.Compare(a.owner, b.owner) })
	e.onePiece[0] = wal.Piece{Bytes: appendExpiredRecord(nil, owners)} // copied by Propose
	err := e.propose(kindExpired, e.onePiece[:], false, &proposal{done: func(uint64, error) {}})
	e.onePiece[0] = wal.Piece{}
	if err != nil {
		e.opts.Logger.Warn("storenode: owner expiry not proposed", "owners", len(owners), "err", err)
		return
	}
	e.repl.expiring = true
}

// dropTableProposed is dropTable under a Proposer, its checks made and t marked dropping (no
// renewal is answered meanwhile), mu held: the drop is proposed and applied on every replica
// by its entry, rechecked there (a table dropped or locked by an entry applied first refuses
// it). A drop refused or given up unmarks t if it is still the table.
func (e *Engine) dropTableProposed(t *table, payload []byte) error {
	err := e.proposeRecord(kindDropTable, payload)
	if err != nil && !t.dropped {
		e.leaseMu.Lock()
		t.dropping = false
		e.leaseMu.Unlock()
	}
	return err
}

// allocIDsProposed is AllocIDs under a Proposer, after its checks, mu held: the ids start past
// the applied and the proposed grants.
func (e *Engine) allocIDsProposed(t *table, pages int) (first, count uint64, err error) {
	from := max(t.nextID, e.repl.nextIDs[t.id])
	if t.cluster.IsCluster() {
		// Ids of the partition's stripes only, one run within a stripe (cluster.go).
		if first, count, err = t.clusterAllocIDsFrom(from, pages); err != nil {
			return 0, 0, err
		}
	} else {
		count, first = uint64(pages)*logicpage.RowsPerPage, from
		if first+count < first || first+count > MaxRowID {
			return 0, 0, fmt.Errorf("%w: table %q has no ids left (row ids stop below %d)", ErrMalformed, t.name, uint64(MaxRowID))
		}
	}
	if e.repl.nextIDs == nil {
		e.repl.nextIDs = make(map[uint32]uint64)
	}
	e.repl.nextIDs[t.id] = first + count
	e.setLease(t, e.opts.Now().Add(e.opts.LeaseDuration))
	e.scratch = appendGrantIDsRecord(e.scratch[:0], t.id, first+count)
	if err := e.proposeRecord(kindGrantIDs, e.scratch); err != nil {
		return 0, 0, err
	}
	return first, count, nil
}

// registerGrantProposed is a new etcd grant (registerGrant) under a Proposer, verified in etcd
// and checked, mu held: the ownership record is proposed (a grant not above one proposed
// before is refused, ErrFenced) and applied on every replica, where a grant not above the
// table's epoch is refused. The holder's incarnation is the leader's soft state, set once the
// grant is applied, if it is still the table's. A registration of the same grant proposed
// twice (concurrent calls) is answered as registered by both.
func (e *Engine) registerGrantProposed(t *table, owner, epoch uint64, inc Incarnation) (base.Grant, bool, error) {
	if p := e.repl.epochs[t.id]; p > epoch {
		return base.Grant{}, false, fmt.Errorf("%w: table %q: etcd grant of revision %d is not above the %d of a grant proposed", ErrFenced, t.name, epoch, p)
	}
	if e.repl.epochs == nil {
		e.repl.epochs = make(map[uint32]uint64)
	}
	e.repl.epochs[t.id] = epoch
	e.scratch = appendGrantOwnerRecord(e.scratch[:0], t.id, owner, epoch)
	err := e.proposeRecord(kindGrantOwner, e.scratch)
	e.leaseMu.Lock()
	ours := !t.dropped && t.holder == owner && t.epoch == epoch
	if ours {
		t.holderInc = inc
	}
	e.leaseMu.Unlock()
	switch {
	case err == nil || ours && errors.Is(err, ErrTableOwned):
		// Applied (a grant above it may have applied since, as a registration that came
		// while the standalone record synced), or applied by a concurrent call's entry.
		g := e.grant(t, owner)
		g.Epoch, g.Lease = epoch, 0
		return g, err == nil, nil
	case errors.Is(err, ErrTableOwned):
		return base.Grant{}, false, fmt.Errorf("%w: table %q: the etcd grant of revision %d was overtaken by another", ErrFenced, t.name, epoch)
	}
	return base.Grant{}, false, err
}

// acquireProposed is a new grant (AcquireFrom) under a Proposer, the old lease checked, mu
// held: the epoch is the next past the applied and the proposed grants. The lease and the
// incarnation are the leader's soft state, set once the grant is applied, if it is still the
// table's.
func (e *Engine) acquireProposed(t *table, owner uint64, inc Incarnation) (base.Grant, error) {
	epoch := max(t.epoch, e.repl.epochs[t.id]) + 1
	if e.repl.epochs == nil {
		e.repl.epochs = make(map[uint32]uint64)
	}
	e.repl.epochs[t.id] = epoch
	e.scratch = appendGrantOwnerRecord(e.scratch[:0], t.id, owner, epoch)
	if err := e.proposeRecord(kindGrantOwner, e.scratch); err != nil {
		return base.Grant{}, err
	}
	e.leaseMu.Lock()
	if t.holder != owner || t.epoch != epoch {
		e.leaseMu.Unlock()
		return base.Grant{}, fmt.Errorf("%w: table %q: the grant of epoch %d was overtaken by another", ErrTableOwned, t.name, epoch)
	}
	t.holderInc = inc
	t.leaseUntil, t.leaseAtOpen = e.opts.Now().Add(e.opts.LeaseDuration), false
	e.leaseMu.Unlock()
	return e.grant(t, owner), nil
}
