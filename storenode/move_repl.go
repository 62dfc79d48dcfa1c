package storenode

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/weftdb/weft/internal/corrupt"
)

// Move steps under a Proposer (docs/replication.md 1.2, kind 16). MoveBegin, MoveFreeze,
// MoveThaw and MoveRetire are proposed by the leader and applied on every replica by their
// entry; a follower refuses them with ErrNotLeader.
//
//   - One rule (moveStep) decides a step on the leader (applied state) and again at apply: the
//     state, the mover epochs, a fresh copy's grants, a freeze's locked rows (ErrTxnLocked). A
//     step another entry made moot first is refused at apply as it would be on the leader.
//   - A step's entry is a kindMoveState record whose epoch is the step's mover epoch, a thaw's
//     and a retire's too (a standalone record of live or retired has 0): the apply needs it to
//     recheck the freeze's epoch. The state applied keeps 0 for live and retired, so a replica's
//     txnstate sidecar holds the standalone record.
//   - A grant or id grant proposed after a freeze and applied after it is refused at apply
//     (ErrMoved, applyEntry); commits and prepares are by checkBatch's move check.
//   - Leader-local soft state (1.3): the dirty-page mark (MoveMark/MoveChanges: a new leader has
//     no mark, ErrMoveLost) and a refused freeze's drain (drainUntil, set by the leader).
//   - Still ErrNotReplicated: MoveActivate (its grants and its state, one step) and MoveWrite
//     (the MoveWriter's seqs assigned by the leader).

// decodeMoveStepEntry decodes a move step's entry: a kindMoveState record, the epoch of live
// and retired the step's mover epoch.
func decodeMoveStepEntry(p []byte) (uint32, MoveState, uint64, error) {
	if len(p) != 16 || p[5] != 0 || p[6] != 0 || p[7] != 0 || p[4] > byte(MoveRetired) {
		return 0, 0, 0, corrupt.Errorf("storenode: move step entry of %d bytes (%x)", len(p), p)
	}
	epoch := binary.LittleEndian.Uint64(p[8:])
	if s := MoveState(p[4]); (s == MoveIncoming || s == MoveFrozen || s == MoveRetired) && epoch == 0 {
		return 0, 0, 0, corrupt.Errorf("storenode: move step entry: %v with mover epoch 0", s)
	}
	return binary.LittleEndian.Uint32(p), MoveState(p[4]), epoch, nil
}

// moveStep decides t's step to state s by mover epoch epoch (s live: a thaw) against the
// state m: noop when the step is there already, else the refusal, the standalone methods'
// rules (move.go). Caller holds mu.
func (e *Engine) moveStep(t *table, m *tableMove, s MoveState, epoch uint64) (noop bool, err error) {
	cur := stateOf(m)
	switch s {
	case MoveIncoming:
		switch cur {
		case MoveIncoming:
			if epoch < m.epoch {
				return false, fmt.Errorf("%w: table %q is filled by mover epoch %d, not %d", ErrFenced, t.name, m.epoch, epoch)
			}
			return epoch == m.epoch, nil
		case MoveLive:
			e.leaseMu.Lock()
			holder, granted := t.holder, t.epoch
			e.leaseMu.Unlock()
			if holder != 0 || granted != 0 {
				return false, fmt.Errorf("%w: table %q was granted (epoch %d): not a fresh copy", ErrMoveState, t.name, granted)
			}
			return false, nil
		}
		return false, fmt.Errorf("%w: table %q is %v, not a fresh copy", ErrMoveState, t.name, cur)
	case MoveFrozen:
		switch cur {
		case MoveFrozen:
			if epoch < m.epoch {
				return false, fmt.Errorf("%w: table %q is frozen by mover epoch %d, not %d", ErrFenced, t.name, m.epoch, epoch)
			}
			return epoch == m.epoch, nil
		case MoveLive:
			if e.tableLocked(t.id) {
				return false, fmt.Errorf("%w: partition table %q has rows of a transaction in doubt: it moves once they are decided (new prepares refused for %v)", ErrTxnLocked, t.name, MoveDrainFor)
			}
			return false, nil
		}
		return false, fmt.Errorf("%w: table %q is %v: not a source", ErrMoveState, t.name, cur)
	case MoveLive, MoveRetired:
		switch {
		case cur == s:
			return true, nil
		case cur != MoveFrozen && s == MoveLive:
			return false, fmt.Errorf("%w: table %q is %v: not a frozen source", ErrMoveState, t.name, cur)
		case cur != MoveFrozen:
			return false, fmt.Errorf("%w: table %q is %v: only a frozen source retires", ErrMoveState, t.name, cur)
		case epoch < m.epoch:
			return false, fmt.Errorf("%w: table %q is frozen by mover epoch %d, not %d", ErrFenced, t.name, m.epoch, epoch)
		}
		return false, nil
	}
	return false, fmt.Errorf("%w: move step to %v", ErrMalformed, s)
}

// moveStepProposed is a move step under a Proposer: decided on the leader's applied state,
// proposed, applied on every replica (rechecked there), and answered with the table's id
// high-water mark once applied (a freeze's: fixed from then on). A freeze refused for a
// transaction in doubt drains the table on the leader (MoveDrainFor). Caller holds mu.
func (e *Engine) moveStepProposed(tableID uint32, s MoveState, epoch uint64) (uint64, error) {
	if err := e.checkLeader(); err != nil {
		return 0, err
	}
	t, m, err := e.moveTable(tableID)
	if err != nil {
		return 0, err
	}
	noop, err := e.moveStep(t, m, s, epoch)
	if err == nil && !noop {
		err = e.proposeRecord(kindMoveState, appendMoveStateRecord(nil, t.id, s, epoch))
	}
	if s == MoveFrozen && errors.Is(err, ErrTxnLocked) && !t.dropped {
		if e.moves == nil {
			e.moves = make(map[uint32]*tableMove)
		}
		m := e.moves[t.id]
		if m == nil {
			m = &tableMove{}
			e.moves[t.id] = m
		}
		m.drainUntil = e.opts.Now().Add(MoveDrainFor)
	}
	if err != nil {
		return 0, err
	}
	return t.nextID, nil
}

// applyMoveStepEntry applies a committed move step at index: rechecked on the applied state
// (moveStep); a refusal is the proposal's outcome. Caller holds mu.
func (e *Engine) applyMoveStepEntry(payload []byte, index uint64) (uint64, error, error) {
	id, s, epoch, err := decodeMoveStepEntry(payload)
	if err != nil {
		return 0, nil, err
	}
	t, ok := e.tables[id]
	if !ok {
		return 0, fmt.Errorf("%w: id %d", ErrTableNotFound, id), nil
	}
	if !t.cluster.IsCluster() {
		return 0, nil, corrupt.Errorf("storenode: apply entry %d: move step of local table %q", index, t.name)
	}
	noop, outcome := e.moveStep(t, e.moveOf(t), s, epoch)
	if outcome != nil || noop {
		return index, outcome, nil
	}
	if s == MoveLive || s == MoveRetired {
		epoch = 0 // the state keeps the standalone record's epoch
	}
	e.applyMoveState(id, s, epoch)
	return index, nil, nil
}
