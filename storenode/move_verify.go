package storenode

import (
	"context"
	"errors"
	"fmt"
)

// Verified move steps (docs/cluster.md, "Moving a partition: what each step verifies"). A
// move step that changes a table's move state (begin, freeze, retire, activate, thaw) from
// a request is checked against etcd first (VerifyMoveStep), as a grant is: one
// linearizable read of the partition's move record, its map entry and etcd's revision
// (MoveVerifier), in a grant verification slot, bounded by GrantVerifyTimeout. Invariants:
//
//   - begin: a move is recorded, its epoch is the step's, this node is its target and the
//     map still places the partition on its source (not switched yet).
//   - freeze: a move is recorded, its epoch is the step's, this node is its source and the
//     map places the partition here.
//   - retire: a move is recorded, its epoch is the step's (so at least the freeze's, which
//     MoveRetire checks), this node is its source and the map no longer places the
//     partition here (switched). The mover retires before it deletes the record; a resumed
//     one records the move again first.
//   - activate: a move is recorded, its epoch is the step's (at least the begin's, which
//     MoveActivate checks), this node is its target and the map places the partition here
//     (switched to this node).
//   - thaw: no move is recorded (a rolled-back move's record goes first) and the map places
//     the partition here (a copy the map left is retired, never thawed).
//   - No epoch or floor above etcd's current revision is taken: a real mover's are
//     revisions etcd wrote, so a freeze or an activation under 2^64-1 cannot lock a
//     partition out of every later mover and grant.
//   - A retired copy is not dropped while the map places its partition here (DropTable).
//   - A node without a GrantVerifier (no etcd: single node) checks nothing here, as before.
//
// "Here" is the address the map names this node by: the server's, given with each step
// (self) and remembered for DropTable. An answer of etcd that refuses the step wraps
// ErrFenced; etcd unreachable or slow is ErrGrantUnverified (retry).

// MoveStep names a verified move step (VerifyMoveStep).
type MoveStep uint8

// The verified move steps.
const (
	MoveStepBegin MoveStep = iota + 1
	MoveStepFreeze
	MoveStepRetire
	MoveStepActivate
	MoveStepThaw
)

// String names the step.
func (s MoveStep) String() string {
	switch s {
	case MoveStepBegin:
		return "begin"
	case MoveStepFreeze:
		return "freeze"
	case MoveStepRetire:
		return "retire"
	case MoveStepActivate:
		return "activate"
	case MoveStepThaw:
		return "thaw"
	}
	return fmt.Sprintf("MoveStep(%d)", uint8(s))
}

// MoveView is what etcd says of one partition's move, from one linearizable read.
type MoveView struct {
	// Moving reports a recorded move; Epoch is its record's ModRevision (the mover epoch),
	// From and To its source and target storage nodes.
	Moving   bool
	Epoch    uint64
	From, To string
	// Node is the storage node the map places the partition on, "" when the map has no
	// such partition (the table dropped, or never created).
	Node string
	// Revision is etcd's revision at the read.
	Revision uint64
}

// MoveVerifier is implemented by a GrantVerifier that can read a partition's move in etcd
// (cluster.GrantVerifier does). A node whose GrantVerifier is not one refuses every
// verified move step (ErrNoVerifier). Any goroutine.
type MoveVerifier interface {
	// MovePlace reads, in one linearizable read, partition part of the partitioned table
	// table: node, where the map places it ("" when nowhere); from, to and epoch, its
	// recorded move's source, target and mover epoch (the record's ModRevision; epoch 0
	// when no move is recorded); revision, etcd's at the read. An error when etcd did not
	// answer (one wrapping ErrFenced when the name cannot be in etcd).
	MovePlace(ctx context.Context, table string, part uint32) (node, from, to string, epoch, revision uint64, err error)
}

// VerifyMoveStep checks move step step of the cluster table tableID against etcd (the
// invariants above): epoch is the step's mover epoch, floor an activation's grant floor,
// self the address the partition map names this node by, conn the requesting connection (a
// storage node's session: its verification slots are capped as a grant registration's,
// verify_slots.go; 0 for the engine's own caller). nil when the step may run; then
// the caller runs it (MoveBegin, MoveFreeze, MoveRetire, MoveActivate, MoveThaw), which
// checks the table's state and epochs under the engine lock. A node without a
// GrantVerifier answers nil. ctx bounds the wait for a verification slot and the read
// (with GrantVerifyTimeout). No lock held: any goroutine but an event loop.
func (e *Engine) VerifyMoveStep(ctx context.Context, tableID uint32, step MoveStep, epoch, floor uint64, self string, conn uint64) error {
	if e.opts.GrantVerifier == nil {
		return nil
	}
	if step < MoveStepBegin || step > MoveStepThaw {
		return fmt.Errorf("%w: move step %v", ErrMalformed, step)
	}
	if epoch == 0 {
		return fmt.Errorf("%w: move %v of mover epoch 0", ErrMalformed, step)
	}
	mv, ok := e.opts.GrantVerifier.(MoveVerifier)
	if !ok {
		return fmt.Errorf("%w: this storage node cannot ask etcd about partition moves", ErrNoVerifier)
	}
	if self == "" {
		return fmt.Errorf("%w: move %v: this storage node does not know its address", ErrNoVerifier, step)
	}
	e.noteMoveSelf(self)
	e.mu.Lock()
	t, _, err := e.moveTable(tableID)
	e.mu.Unlock()
	if err != nil {
		return err
	}
	base, _ := clusterTableName(t.name, t.cluster.Partition)
	v, err := e.moveView(ctx, conn, mv, base, t.cluster.Partition)
	if err != nil {
		return fmt.Errorf("move %v of table %q: %w", step, t.name, err)
	}
	if err := checkMoveStep(v, step, epoch, floor, self); err != nil {
		e.opts.Logger.Warn("storenode: move step refused", "table", t.name, "step", step.String(), "epoch", epoch, "err", err)
		return fmt.Errorf("%w: move %v of table %q: %w", ErrFenced, step, t.name, err)
	}
	return nil
}

// checkMoveStep is VerifyMoveStep's rule for one step, given etcd's view.
func checkMoveStep(v MoveView, step MoveStep, epoch, floor uint64, self string) error {
	switch {
	case epoch > v.Revision:
		return fmt.Errorf("mover epoch %d is above etcd's revision %d", epoch, v.Revision)
	case step == MoveStepActivate && (floor == 0 || floor > v.Revision):
		return fmt.Errorf("grant floor %d is above etcd's revision %d", floor, v.Revision)
	}
	if step != MoveStepThaw {
		if !v.Moving || v.Epoch != epoch {
			return fmt.Errorf("no move of mover epoch %d is recorded in etcd", epoch)
		}
		if (step == MoveStepBegin || step == MoveStepActivate) && v.To != self ||
			(step == MoveStepFreeze || step == MoveStepRetire) && v.From != self {
			return fmt.Errorf("the recorded move is from %s to %s, and this node is %s", v.From, v.To, self)
		}
	}
	switch step {
	case MoveStepBegin, MoveStepFreeze:
		if v.Node != v.From {
			return fmt.Errorf("the map places the partition on %q, not the move's source %s", v.Node, v.From)
		}
	case MoveStepRetire:
		if v.Node == self {
			return fmt.Errorf("the map still places the partition on this node %s", self)
		}
	case MoveStepActivate:
		if v.Node != self {
			return fmt.Errorf("the map places the partition on %q, not on this node %s", v.Node, self)
		}
	case MoveStepThaw:
		if v.Moving {
			return fmt.Errorf("a move from %s to %s is recorded (mover epoch %d)", v.From, v.To, v.Epoch)
		}
		if v.Node != self {
			return fmt.Errorf("the map places the partition on %q, not on this node %s", v.Node, self)
		}
	}
	return nil
}

// moveView runs mv's read in a grant verification slot of connection conn (takeVerifySlot:
// a connection's is refused at once when it may take none, the engine's own waits), the wait
// and the read bounded by GrantVerifyTimeout together: ErrGrantUnverified when etcd did not
// answer. No lock held.
func (e *Engine) moveView(ctx context.Context, conn uint64, mv MoveVerifier, table string, part uint32) (MoveView, error) {
	ctx, cancel := context.WithTimeout(ctx, e.opts.GrantVerifyTimeout)
	defer cancel()
	if err := e.takeVerifySlot(ctx, conn); err != nil {
		return MoveView{}, err
	}
	defer e.releaseVerifySlot(conn)
	node, from, to, epoch, rev, err := mv.MovePlace(ctx, table, part)
	switch {
	case err == nil:
		return MoveView{Moving: epoch != 0, Epoch: epoch, From: from, To: to, Node: node, Revision: rev}, nil
	case errors.Is(err, ErrFenced):
		return MoveView{}, err
	default:
		return MoveView{}, fmt.Errorf("%w: read the move of partition %d in etcd: %w", ErrGrantUnverified, part, err)
	}
}

// noteMoveSelf remembers the address the map names this node by, for DropTable.
func (e *Engine) noteMoveSelf(self string) {
	if p := e.moveSelf.Load(); p != nil && *p == self {
		return
	}
	e.moveSelf.Store(&self)
}

// verifyRetiredDrop returns nil when etcd's map does not place retired copy t's partition
// on this node, ErrTableOwned when it does, ErrGrantUnverified when etcd did not answer.
// A node that cannot ask (no MoveVerifier, or no verified step told it its address since it
// started) answers nil, as before the steps were verified: since they are, a copy is retired
// only once the map left this node, and the map never comes back to it (a move's begin
// takes only a fresh copy). No lock held.
func (e *Engine) verifyRetiredDrop(t *table) error {
	mv, ok := e.opts.GrantVerifier.(MoveVerifier)
	self := e.moveSelf.Load()
	if !ok || self == nil {
		return nil
	}
	base, _ := clusterTableName(t.name, t.cluster.Partition)
	v, err := e.moveView(context.Background(), 0, mv, base, t.cluster.Partition)
	switch {
	case errors.Is(err, ErrFenced):
		return nil // a name etcd cannot hold: not in the map
	case err != nil:
		return fmt.Errorf("cluster table %q: %w", t.name, err)
	case v.Node == *self:
		return fmt.Errorf("%w: cluster table %q is retired, but etcd's partition map places it on this node", ErrTableOwned, t.name)
	}
	return nil
}
