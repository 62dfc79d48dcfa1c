package storenode

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/logicpage"
)

// Partition moves (docs/cluster.md, "Moving a partition"). A cluster table's partition is
// copied from its source storage node to a target one by a mover (cluster/node's Table.Move);
// this file is a storage node's side of it, on either end:
//
//   - Target: the mover creates the partition's table (CreateClusterTable) and marks it
//     incoming (MoveBegin). An incoming table takes no grant, no id grant, no commit and no
//     read other than the engine's own (trusted); its rows are written only by MoveWrite.
//     MoveActivate makes it live: no holder, its epoch floor given by the mover (grants of
//     an epoch above it are accepted: the grant the switch kept, or only grants made after
//     the floor's read; cluster.MoveFloor), its id high-water at least the source's.
//   - Source: MoveMark starts remembering the pages written to the table (memory only; a
//     restart forgets the mark, and MoveChanges then fails with ErrMoveLost); MoveChanges
//     hands them out, a bounded number per call. MoveFreeze stops every grant, id grant and
//     commit of the table (ErrMoved; reads go on), refused while a prepared transaction holds
//     rows of the table (ErrTxnLocked: a partition with transactions in doubt is not moved;
//     the refusal drains the table: new prepares of it are refused, ErrMoved, for
//     MoveDrainFor, so the ones in doubt decide and the next freeze is not refused for new
//     ones), and from then on no transaction can be prepared on it. A freeze is its mover's (the
//     mover epoch, logged; a mover adopting a frozen source freezes it again under its own):
//     MoveThaw undoes it (a move rolled back) only for that epoch or a higher one; MoveRetire
//     (of that epoch or a higher one) fences the copy for good once the map points elsewhere:
//     it refuses everything, reads too (ErrMoved), and may be dropped.
//   - A request's begin, freeze, retire, activate and thaw are verified against etcd first
//     (VerifyMoveStep, move_verify.go); the methods here check states and epochs only.
//
// The states frozen, incoming and retired are logged (kindMoveState, synced before the call
// returns) and carried by every checkpoint (re-logged after its checkpoint LSN, as the
// two-phase commit's records), so a restart keeps them. A table without a move costs the
// commit path one nil-map check.

// MoveState is a table's state in a partition move.
type MoveState uint8

// Move states. Part of the WAL format (kindMoveState); do not change.
const (
	// MoveLive is a table no move concerns.
	MoveLive MoveState = 0
	// MoveFrozen is a source whose commits and grants are stopped for its final catch-up.
	MoveFrozen MoveState = 1
	// MoveIncoming is a target being filled by the mover.
	MoveIncoming MoveState = 2
	// MoveRetired is a source the map no longer points at: fenced for good.
	MoveRetired MoveState = 3
)

// String names the state.
func (s MoveState) String() string {
	switch s {
	case MoveLive:
		return "live"
	case MoveFrozen:
		return "frozen"
	case MoveIncoming:
		return "incoming"
	case MoveRetired:
		return "retired"
	}
	return fmt.Sprintf("MoveState(%d)", uint8(s))
}

// kindMoveState logs a table's move state: table u32 | state u8 | reserved [3] | mover
// epoch u64 (of an incoming copy: the epoch MoveWrite must carry, nonzero; of a frozen
// source: the epoch of the mover that froze it, which a thaw must carry at least (0 in a
// record of a store from before the rule: any thaw); 0 otherwise).
const kindMoveState byte = 16

// MoveChangesMax bounds the pages one MoveChanges call returns.
const MoveChangesMax = 4096

// MoveWriter is the owner id the engine logs MoveWrite's commit records under (its own
// dedup-window entry, seqs counted by the engine under mu). It is reserved: Connect,
// Acquire, RegisterGrant, Commit and PrepareTxn refuse it (ErrMalformed), so no client's
// seqs share its window (a client's seq 2^64-1 made the next MoveWrite log seq 0, a record
// replay refuses: the storage node could not restart).
const MoveWriter uint64 = ^uint64(0)

// tableMove is one table's move state, in Engine.moves (guarded by mu).
type tableMove struct {
	state MoveState
	// epoch is an incoming copy's mover epoch (MoveBegin): MoveWrite of another is refused;
	// a frozen source's, the epoch of the mover that froze it (MoveFreeze): a thaw of a lower
	// one is refused.
	epoch uint64
	// token names the mark of a source (0: none); dirty holds the pages written since the
	// mark or the last MoveChanges that handed them out, a bit per page: word page/64, bit
	// page%64 (a hot table's mark costs about a bit per page written, not a map entry).
	// Memory only.
	token uint64
	dirty map[uint64]uint64
	// drainUntil is the end of a source's drain: a freeze refused for a transaction in doubt
	// refuses new prepares of the table (ErrMoved) until then, so the ones in doubt decide
	// and the mover's next freeze is not refused again for new ones. Memory only.
	drainUntil time.Time
}

// MoveDrainFor is how long a freeze refused for a transaction in doubt refuses new prepares
// of the table: longer than a mover's pause between freezes (cluster/node), short enough
// that a mover that died leaves the partition's two-phase commits refused only briefly.
const MoveDrainFor = time.Second

func appendMoveStateRecord(dst []byte, table uint32, s MoveState, epoch uint64) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, table)
	dst = append(dst, byte(s), 0, 0, 0)
	return binary.LittleEndian.AppendUint64(dst, epoch)
}

func decodeMoveStateRecord(p []byte) (uint32, MoveState, uint64, error) {
	if len(p) != 16 || p[5] != 0 || p[6] != 0 || p[7] != 0 || p[4] > byte(MoveRetired) {
		return 0, 0, 0, corrupt.Errorf("storenode: move state record of %d bytes (%x)", len(p), p)
	}
	epoch := binary.LittleEndian.Uint64(p[8:])
	if s := MoveState(p[4]); s == MoveIncoming && epoch == 0 || (s == MoveLive || s == MoveRetired) && epoch != 0 {
		return 0, 0, 0, corrupt.Errorf("storenode: move state record: %v with mover epoch %d", MoveState(p[4]), epoch)
	}
	return binary.LittleEndian.Uint32(p), MoveState(p[4]), epoch, nil
}

// moveOf returns t's move entry, nil for a table no move concerns. Caller holds mu.
func (e *Engine) moveOf(t *table) *tableMove {
	if e.moves == nil {
		return nil
	}
	return e.moves[t.id]
}

// moveRefuses is the check of a grant, id grant or commit of t: ErrMoved unless t is live.
// Caller holds mu.
func (e *Engine) moveRefuses(t *table) error {
	if e.moves == nil {
		return nil
	}
	if m := e.moves[t.id]; m != nil && m.state != MoveLive {
		return fmt.Errorf("%w: table %q is %v", ErrMoved, t.name, m.state)
	}
	return nil
}

// moveDrains is the check of a prepare of b: ErrMoved while a table it writes drains for a
// move's freeze (MoveFreeze refused for a transaction in doubt). Caller holds mu.
func (e *Engine) moveDrains(b *base.Batch) error {
	if e.moves == nil {
		return nil
	}
	for i := range b.Fences {
		m := e.moves[b.Fences[i].Table]
		if m == nil || m.drainUntil.IsZero() {
			continue
		}
		if left := m.drainUntil.Sub(e.opts.Now()); left > 0 {
			return fmt.Errorf("%w: table %d drains its transactions in doubt for a move's freeze (%v left)", ErrMoved, b.Fences[i].Table, left.Round(time.Millisecond))
		}
		m.drainUntil = time.Time{}
	}
	return nil
}

// moveRefusesRead is the check of an untrusted read of t: incoming and retired copies are
// not served (dir: a page directory, which an incoming copy lists for its mover: it shows
// no row). Caller holds mu.
func (e *Engine) moveRefusesRead(t *table, dir bool) error {
	if e.moves == nil {
		return nil
	}
	if m := e.moves[t.id]; m != nil && (m.state == MoveIncoming && !dir || m.state == MoveRetired) {
		return fmt.Errorf("%w: table %q is %v: not served", ErrMoved, t.name, m.state)
	}
	return nil
}

// moveNoteWrite remembers a written page for a marked source. Caller holds mu.
func (e *Engine) moveNoteWrite(s *base.Segment) {
	if m := e.moves[s.Table]; m != nil && m.dirty != nil {
		m.dirty[s.Page/64] |= 1 << (s.Page % 64)
	}
}

// setMoveState logs and applies t's new state, waiting for the record's sync. The state is
// applied as the record is appended, under the same hold of mu: every record after it in
// the WAL (a commit, a prepare, a grant, taken while mu is released for the sync) was
// checked against the new state, so nothing slips in after a freeze's record with the
// table still live. (A failed sync fail-stops the engine: the state applied early serves
// nothing.) Caller holds mu (released while waiting).
func (e *Engine) setMoveState(t *table, s MoveState, epoch uint64) error {
	e.scratch = appendMoveStateRecord(e.scratch[:0], t.id, s, epoch)
	ch := make(chan error, 1)
	if _, err := e.appendRecord(kindMoveState, e.scratch, true, func(_ uint64, err error) { ch <- err }); err != nil {
		return err
	}
	e.applyMoveState(t.id, s, epoch)
	e.mu.Unlock()
	err := <-ch
	e.mu.Lock()
	return err
}

// applyMoveState sets table id's state (replay, setMoveState). Caller holds mu.
func (e *Engine) applyMoveState(id uint32, s MoveState, epoch uint64) {
	if s == MoveLive {
		// Live again (thawed, activated): the mark goes too, so a rolled-back move leaves
		// no page set growing with the table's writes.
		delete(e.moves, id)
		if len(e.moves) == 0 {
			e.moves = nil // the commit path's check is a nil check again
		}
		return
	}
	if e.moves == nil {
		e.moves = make(map[uint32]*tableMove)
	}
	m := e.moves[id]
	if m == nil {
		m = &tableMove{}
		e.moves[id] = m
	}
	m.state, m.epoch = s, epoch
	if s != MoveFrozen {
		m.token, m.dirty = 0, nil
	}
}

// movesLive reports whether a logged move state must be carried. Caller holds mu.
func (e *Engine) movesLive() bool {
	for _, m := range e.moves {
		if m.state != MoveLive {
			return true
		}
	}
	return false
}

// carryMoves re-logs every table's non-live move state after the checkpoint LSN and returns
// the last LSN it appended (0 when none). Caller holds mu, in the checkpoint's snapshot hold.
func (e *Engine) carryMoves() (uint64, error) {
	var last uint64
	for id, m := range e.moves {
		if m.state == MoveLive {
			continue
		}
		e.scratch = appendMoveStateRecord(e.scratch[:0], id, m.state, m.epoch)
		lsn, err := e.appendRecord(kindMoveState, e.scratch, false, noAck)
		if err != nil {
			return 0, err
		}
		last = lsn
	}
	return last, nil
}

// moveTable looks up a cluster table for a move call. Caller holds mu.
func (e *Engine) moveTable(tableID uint32) (*table, *tableMove, error) {
	if err := e.usable(); err != nil {
		return nil, nil, err
	}
	t, err := e.table(tableID)
	if err != nil {
		return nil, nil, err
	}
	if !t.cluster.IsCluster() {
		return nil, nil, fmt.Errorf("%w: table %q is local: only a cluster table's partition moves", ErrMalformed, t.name)
	}
	return t, e.moveOf(t), nil
}

func stateOf(m *tableMove) MoveState {
	if m == nil {
		return MoveLive
	}
	return m.state
}

// MoveStatus reports table tableID's move state and its id high-water mark. Any goroutine.
func (e *Engine) MoveStatus(tableID uint32) (MoveState, uint64, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	t, m, err := e.moveTable(tableID)
	if err != nil {
		return 0, 0, err
	}
	return stateOf(m), t.nextID, nil
}

// MoveBegin marks a target's table incoming under mover epoch epoch (nonzero; the etcd
// revision of the move record the mover holds): from then on only MoveWrite of that epoch
// writes it. Only a table nobody was ever granted (epoch 0) and that is live, or incoming
// already under the same or a lower mover epoch (a retry, a mover that took the move over),
// may be: a lower epoch than the table's is ErrFenced (a mover that lost the move), anything
// else ErrMoveState. Any goroutine; it waits for the record's sync.
func (e *Engine) MoveBegin(tableID uint32, epoch uint64) error {
	if epoch == 0 {
		return fmt.Errorf("%w: move begin of mover epoch 0", ErrMalformed)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.replicated() {
		_, err := e.moveStepProposed(tableID, MoveIncoming, epoch) // move_repl.go
		return err
	}
	t, m, err := e.moveTable(tableID)
	if err != nil {
		return err
	}
	switch stateOf(m) {
	case MoveIncoming:
		switch {
		case epoch == m.epoch:
			return nil
		case epoch < m.epoch:
			return fmt.Errorf("%w: table %q is filled by mover epoch %d, not %d", ErrFenced, t.name, m.epoch, epoch)
		}
		return e.setMoveState(t, MoveIncoming, epoch)
	case MoveLive:
	default:
		return fmt.Errorf("%w: table %q is %v, not a fresh copy", ErrMoveState, t.name, stateOf(m))
	}
	e.leaseMu.Lock()
	holder, granted := t.holder, t.epoch
	e.leaseMu.Unlock()
	if holder != 0 || granted != 0 {
		return fmt.Errorf("%w: table %q was granted (epoch %d): not a fresh copy", ErrMoveState, t.name, granted)
	}
	return e.setMoveState(t, MoveIncoming, epoch)
}

// MoveMark starts remembering the pages written to a source's table and returns the mark's
// token (a new one each call: the pages remembered so far are dropped, the caller copies the
// whole table after it). Any goroutine.
func (e *Engine) MoveMark(tableID uint32) (uint64, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.checkLeader(); err != nil {
		return 0, err // a mark is the leader's (docs/replication.md 1.3)
	}
	t, m, err := e.moveTable(tableID)
	if err != nil {
		return 0, err
	}
	if s := stateOf(m); s != MoveLive && s != MoveFrozen {
		return 0, fmt.Errorf("%w: table %q is %v: not a source", ErrMoveState, t.name, s)
	}
	if m == nil {
		if e.moves == nil {
			e.moves = make(map[uint32]*tableMove)
		}
		m = &tableMove{}
		e.moves[t.id] = m
	}
	m.token = rand.Uint64() | 1
	m.dirty = make(map[uint64]uint64)
	return m.token, nil
}

// MoveChanges appends to dst up to max (1..MoveChangesMax) pages written to the table since
// the mark or the last MoveChanges (ascending within the call), forgets them, and reports
// whether more remain; its work under the engine lock is bounded by max. A token that is not the table's mark (a restart, a newer mark) is ErrMoveLost:
// the caller marks again and copies the whole table. The pages' rows are read afterwards
// (ReadRowsAs): a page written again meanwhile is listed again by the next call.
func (e *Engine) MoveChanges(tableID uint32, token uint64, max int, dst []uint64) ([]uint64, bool, error) {
	if max <= 0 || max > MoveChangesMax {
		max = MoveChangesMax
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.checkLeader(); err != nil {
		return dst, false, err
	}
	t, m, err := e.moveTable(tableID)
	if err != nil {
		return dst, false, err
	}
	if m == nil || m.dirty == nil || m.token != token || token == 0 {
		return dst, false, fmt.Errorf("%w: table %q has no mark %#x (restarted, or marked again)", ErrMoveLost, t.name, token)
	}
	// At most max pages taken out of the set (any of them: a round copies what it was
	// given, the next round the rest), then sorted: under mu, the work is bounded by max.
	start := len(dst)
	for w, bitsLeft := range m.dirty {
		if len(dst)-start == max {
			break
		}
		for ; bitsLeft != 0 && len(dst)-start < max; bitsLeft &= bitsLeft - 1 {
			dst = append(dst, w*64+uint64(bits.TrailingZeros64(bitsLeft)))
		}
		if bitsLeft == 0 {
			delete(m.dirty, w) // deleting the current entry during range is allowed
		} else {
			m.dirty[w] = bitsLeft
		}
	}
	out := dst[start:]
	slices.Sort(out)
	more := len(m.dirty) > 0
	return dst, more, nil
}

// MoveFreeze stops the source table's grants, id grants and commits (ErrMoved), for good
// until MoveThaw or MoveRetire, under mover epoch epoch (the freezer's: only a thaw of at
// least that epoch undoes it), and returns its id high-water mark, fixed from then on. A
// table with rows of a prepared transaction is refused (ErrTxnLocked): a move waits until
// its transactions are decided. Frozen already: under a lower epoch, the freeze is taken
// over (a mover that adopted a frozen source: the late thaw of the one that froze it must
// not undo its freeze), under a higher one ErrFenced, else answered again. Any goroutine;
// it waits for the record's sync.
func (e *Engine) MoveFreeze(tableID uint32, epoch uint64) (uint64, error) {
	if epoch == 0 {
		return 0, fmt.Errorf("%w: move freeze of mover epoch 0", ErrMalformed)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.replicated() {
		return e.moveStepProposed(tableID, MoveFrozen, epoch)
	}
	t, m, err := e.moveTable(tableID)
	if err != nil {
		return 0, err
	}
	switch s := stateOf(m); s {
	case MoveFrozen:
		switch {
		case epoch < m.epoch:
			return 0, fmt.Errorf("%w: table %q is frozen by mover epoch %d, not %d", ErrFenced, t.name, m.epoch, epoch)
		case epoch > m.epoch:
			if err := e.setMoveState(t, MoveFrozen, epoch); err != nil {
				return 0, err
			}
		}
		return t.nextID, nil
	case MoveLive:
	default:
		return 0, fmt.Errorf("%w: table %q is %v: not a source", ErrMoveState, t.name, s)
	}
	if e.tableLocked(t.id) {
		if m == nil {
			if e.moves == nil {
				e.moves = make(map[uint32]*tableMove)
			}
			m = &tableMove{}
			e.moves[t.id] = m
		}
		m.drainUntil = e.opts.Now().Add(MoveDrainFor)
		return 0, fmt.Errorf("%w: partition table %q has rows of a transaction in doubt: it moves once they are decided (new prepares refused for %v)", ErrTxnLocked, t.name, MoveDrainFor)
	}
	if err := e.setMoveState(t, MoveFrozen, epoch); err != nil {
		return 0, err
	}
	return t.nextID, nil
}

// MoveThaw makes a frozen source live again (a move rolled back by the mover of epoch
// epoch). A freeze of a higher mover epoch is not undone (ErrFenced: a mover took the move
// over after this one gave it up). Live already: no-op.
func (e *Engine) MoveThaw(tableID uint32, epoch uint64) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.replicated() {
		_, err := e.moveStepProposed(tableID, MoveLive, epoch)
		return err
	}
	t, m, err := e.moveTable(tableID)
	if err != nil {
		return err
	}
	switch s := stateOf(m); s {
	case MoveLive:
		return nil
	case MoveFrozen:
		if epoch < m.epoch {
			return fmt.Errorf("%w: table %q is frozen by mover epoch %d, not %d", ErrFenced, t.name, m.epoch, epoch)
		}
		return e.setMoveState(t, MoveLive, 0)
	default:
		return fmt.Errorf("%w: table %q is %v: not a frozen source", ErrMoveState, t.name, s)
	}
}

// MoveRetire fences a frozen source for good (the map points at its copy), for the mover of
// epoch epoch: at least the freeze's (ErrFenced otherwise: a mover that lost the move, or a
// stranger). Retired already: no-op.
func (e *Engine) MoveRetire(tableID uint32, epoch uint64) error {
	if epoch == 0 {
		return fmt.Errorf("%w: move retire of mover epoch 0", ErrMalformed)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.replicated() {
		_, err := e.moveStepProposed(tableID, MoveRetired, epoch)
		return err
	}
	t, m, err := e.moveTable(tableID)
	if err != nil {
		return err
	}
	switch s := stateOf(m); s {
	case MoveRetired:
		return nil
	case MoveFrozen:
		if epoch < m.epoch {
			return fmt.Errorf("%w: table %q is frozen by mover epoch %d, not %d", ErrFenced, t.name, m.epoch, epoch)
		}
		return e.setMoveState(t, MoveRetired, 0)
	default:
		return fmt.Errorf("%w: table %q is %v: only a frozen source retires", ErrMoveState, t.name, s)
	}
}

// MoveActivate makes an incoming table live for the mover of epoch epoch (at least the
// begin's: ErrFenced otherwise): no holder, epoch floor (grants of an epoch above
// it are accepted: cluster.MoveFloor, the owner's epoch minus one, or an etcd revision
// when nobody owns the partition), ids granted up to at least
// nextID (the frozen source's). Live already with an epoch at least floor: only the id
// high-water mark raised to nextID. Any goroutine; it waits for the records' sync.
func (e *Engine) MoveActivate(tableID uint32, epoch, floor, nextID uint64) error {
	if epoch == 0 || floor == 0 || nextID > MaxRowID {
		return fmt.Errorf("%w: activation of mover epoch %d with floor %d next id %d", ErrMalformed, epoch, floor, nextID)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.replicated() {
		// Before any change: its id grant is applied ahead of its record.
		return fmt.Errorf("%w: move activate", ErrNotReplicated)
	}
	t, m, err := e.moveTable(tableID)
	if err != nil {
		return err
	}
	e.leaseMu.Lock()
	granted := t.epoch
	e.leaseMu.Unlock()
	switch s := stateOf(m); s {
	case MoveLive:
		if granted >= floor {
			// Activated already (a retry, or a request that came first): the id high-water
			// mark is raised to the source's all the same, so ids the source granted are
			// never granted here again.
			if nextID > t.nextID {
				e.applyGrantIDs(t, nextID)
				e.scratch = appendGrantIDsRecord(e.scratch[:0], t.id, nextID)
				return e.appendAndWait(kindGrantIDs, e.scratch)
			}
			return nil
		}
		return fmt.Errorf("%w: table %q is live below the floor %d: not an incoming copy", ErrMoveState, t.name, floor)
	case MoveIncoming:
		if epoch < m.epoch {
			return fmt.Errorf("%w: table %q is filled by mover epoch %d, not %d", ErrFenced, t.name, m.epoch, epoch)
		}
	default:
		return fmt.Errorf("%w: table %q is %v: not an incoming copy", ErrMoveState, t.name, s)
	}
	if nextID > t.nextID {
		e.applyGrantIDs(t, nextID)
		e.scratch = appendGrantIDsRecord(e.scratch[:0], t.id, nextID)
		if _, err := e.appendRecord(kindGrantIDs, e.scratch, false, noAck); err != nil {
			return err
		}
	}
	if granted < floor { // not logged already by an activation that stopped before its state
		e.scratch = appendGrantOwnerRecord(e.scratch[:0], t.id, 0, floor)
		if _, err := e.appendRecord(kindGrantOwner, e.scratch, false, noAck); err != nil {
			return err
		}
		e.leaseMu.Lock()
		e.applyGrantOwnerLocked(t, 0, floor)
		e.leaseMu.Unlock()
	}
	return e.setMoveState(t, MoveLive, 0)
}

// MoveWrite writes a copy's rows into an incoming table: every segment's data rows are set
// and its clear slots deleted, as one commit record (logged under MoveWriter), waiting for
// its sync. Segments must be of incoming tables (ErrMoveState otherwise) filled under mover
// epoch epoch (ErrFenced otherwise: a mover that lost the move, whose late write must not
// land over its successor's), pages of the table's partition; rows beyond the table's id
// high-water mark raise it. It returns the record's LSN. The rows are copied into the WAL
// during the call. Any goroutine.
func (e *Engine) MoveWrite(segs []base.Segment, epoch uint64) (uint64, error) {
	if len(segs) == 0 || len(segs) > txnSegmentsMax {
		return 0, fmt.Errorf("%w: move write of %d segments", ErrMalformed, len(segs))
	}
	b := &base.Batch{Owner: MoveWriter, Segments: segs}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.replicated() {
		// Before any change: its id grants are applied ahead of its records.
		return 0, fmt.Errorf("%w: move write", ErrNotReplicated)
	}
	for {
		if err := e.usable(); err != nil {
			return 0, err
		}
		var raise []*table
		for i := range segs {
			s := &segs[i]
			t, m, err := e.moveTable(s.Table)
			if err != nil {
				return 0, err
			}
			if stateOf(m) != MoveIncoming {
				return 0, fmt.Errorf("%w: table %q is %v: move writes go to an incoming copy only", ErrMoveState, t.name, stateOf(m))
			}
			if m.epoch != epoch {
				return 0, fmt.Errorf("%w: table %q is filled by mover epoch %d, not %d", ErrFenced, t.name, m.epoch, epoch)
			}
			if s.Page >= tablePagesMax {
				return 0, fmt.Errorf("%w: page %d beyond a table's last page", ErrMalformed, s.Page)
			}
			if err := t.geo.CheckSegment(*s); err != nil {
				return 0, fmt.Errorf("%w: table %q: %w", ErrMalformed, t.name, err)
			}
			if t.cluster.PartitionOfPage(s.Page) != t.cluster.Partition {
				return 0, fmt.Errorf("%w: page %d of table %q is not in its partition %d", ErrMalformed, s.Page, t.name, t.cluster.Partition)
			}
			if last := segmentLastID(s.Page, s.Data, s.Clear); last >= t.nextID {
				raise = append(raise, t)
			}
		}
		b.Fences = b.Fences[:0]
		for i := range segs {
			if !fenced(b.Fences, segs[i].Table) {
				b.Fences = append(b.Fences, base.Fence{Table: segs[i].Table})
			}
		}
		room, err := e.reserveFrames(b)
		if err != nil {
			return 0, err
		}
		if room {
			for _, t := range raise {
				next := t.nextID
				for i := range segs {
					if segs[i].Table == t.id {
						next = max(next, (segs[i].Page+1)*logicpage.RowsPerPage)
					}
				}
				if next > t.nextID {
					e.applyGrantIDs(t, next)
					e.scratch = appendGrantIDsRecord(e.scratch[:0], t.id, next)
					if _, err := e.appendRecord(kindGrantIDs, e.scratch, false, noAck); err != nil {
						e.unpinFrames(b, len(segs))
						return 0, err
					}
				}
			}
			break
		}
		gen := e.ckptGen
		e.requestCheckpoint()
		for e.ckptGen == gen && e.usable() == nil {
			e.cond.Wait()
		}
	}
	o := e.owners[MoveWriter]
	b.Seq = 1
	if o != nil {
		b.Seq = o.lastSeq + 1
	}
	hash := batchHash(b)
	ch := make(chan error, 1)
	lsn, err := e.appendPieces(kindCommit, e.commitPieces(b, hash), true, func(_ uint64, err error) { ch <- err })
	clear(e.pieces)
	if err != nil {
		e.unpinFrames(b, len(segs))
		return 0, err
	}
	e.applyCommitBatch(b, hash, lsn)
	e.mu.Unlock()
	err = <-ch
	e.mu.Lock()
	if err != nil {
		return 0, err
	}
	return lsn, nil
}
