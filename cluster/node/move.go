package node

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// Partition moves (docs/cluster.md, "Moving a partition"): Table.Move copies a partition's
// table from its storage node to another, catches up with the writes made meanwhile, freezes
// the source, switches the map in one etcd transaction that keeps the owner's grant (ownership
// never changes hands at a switch), makes the copy live taking that grant (its floor just
// below the grant's epoch; the floor read's etcd revision when nobody owns the partition) and fences
// the source for good. The storage nodes verify each step that changes a copy's state
// against etcd (begin, freeze, retire, activate, thaw, under this mover's epoch). Every step is
// recorded (the etcd move record, the storage nodes' logged move states) so that a mover that
// died anywhere is finished or rolled back by the next Move of the partition.

// ErrMoveRefused is returned by Move for a partition that cannot move now: transactions in
// doubt kept its rows locked at the source for longer than a move waits for them (10 s:
// txnode.ErrTxnLocked wrapped, the message says how long and how many freezes were
// refused), or the target's table of that name is not a fresh copy.
var ErrMoveRefused = errors.New("node: partition move refused")

// Move steps, in order, as the test hook hears them. Part of the documented protocol.
const (
	MoveStepRecorded  = "recorded"  // the etcd move record exists
	MoveStepIncoming  = "incoming"  // the target's table exists, incoming
	MoveStepCopied    = "copied"    // the source's rows as of the mark are on the target
	MoveStepCaughtUp  = "caught-up" // the changes since the mark are, but for a short tail
	MoveStepFlushed   = "flushed"   // the owner flushed its writes and holds new ones (moveflush.go)
	MoveStepFrozen    = "frozen"    // the source refuses commits and grants
	MoveStepFinal     = "final"     // the target holds the frozen source's rows exactly
	MoveStepSwitched  = "switched"  // the map points at the target; the owner keeps its grant
	MoveStepActivated = "activated" // the target is live, taking the owner's grant (or only later ones)
	MoveStepRetired   = "retired"   // the source is fenced for good
	MoveStepDone      = "done"      // the move record is gone
)

// moveStepHook, set by tests only, hears each step once it is durable.
var moveStepHook func(step string)

func moveStep(step string) {
	if h := moveStepHook; h != nil {
		h(step)
	}
}

// moveCatchUpRounds bounds the catch-up rounds before the freeze; moveTailPages is the tail
// short enough to copy while frozen.
const (
	moveCatchUpRounds = 8
	moveTailPages     = 64
)

// Move moves partition part of the table to storage node to (host:port), under writes of
// its owner (any node): see docs/cluster.md, "Moving a partition". It returns once the map
// points at to, the copy there is live and the old copy fenced; a partition on to already
// (and no move recorded) is a no-op. The partition's owner, if any, keeps its grant (no
// other node can acquire the partition meanwhile); its writes from the freeze until it
// follows the switch fail with a retryable *NotOwnerError (never acknowledged, so nothing is
// lost); its Table follows the map and registers the same grant with the new storage node
// (follow.go).
// A move recorded by a mover that died is resumed (to must be its target, else
// cluster.ErrMoveInProgress); a Move of a partition another Move of this node is running is
// cluster.ErrMoveInProgress. While a transaction in doubt (a two-phase commit prepared, not
// yet decided) holds rows of the partition at the source, the source cannot be frozen: the
// move waits its turn, trying the freeze again after a growing pause (up to 25 ms), the
// partition written meanwhile, for at most 10 s from the first refusal, within ctx; so a move
// under two-phase load goes through without the caller retrying. Only past that bound is it
// refused, rolled back, with ErrMoveRefused (a transaction in doubt that long has a dead
// coordinator: its storage node's resolver decides it once that coordinator's lease is gone;
// Move again then). Any goroutine; ctx bounds the whole move (a move cut short by ctx is
// resumed by the next Move).
func (t *Table) Move(ctx context.Context, part uint32, to string) error {
	if err := t.n.closedErr(); err != nil {
		return err
	}
	if part >= uint32(len(t.parts)) {
		return fmt.Errorf("node: %w: table %q has no partition %d", cluster.ErrInvalid, t.m.Name, part)
	}
	// One Move of a partition at a time on this node: the move record names the mover by
	// its node's session lease, so BeginMove takes a second Move of the same node for a retry
	// of the first (same mover epoch) and both would run, one's late writes of rows read
	// before the freeze landing over the other's final catch-up.
	key := moveKey{n: t.n, table: t.m.Name, part: part}
	if _, busy := movesRunning.LoadOrStore(key, struct{}{}); busy {
		return fmt.Errorf("node: move table %q partition %d: %w: another Move of it runs on this node", t.m.Name, part, cluster.ErrMoveInProgress)
	}
	defer movesRunning.Delete(key)
	m := &mover{t: t, part: part, name: base.PartitionTableName(t.m.Name, part)}
	defer m.close()
	return m.run(ctx, to)
}

// movesRunning holds the moves (moveKey) a Move of this process runs.
var movesRunning sync.Map

type moveKey struct {
	n     *Node
	table string
	part  uint32
}

// mover is one Move call.
type mover struct {
	t        *Table
	part     uint32
	name     string
	rec      cluster.MoveRecord
	epoch    uint64 // the mover epoch: the move record's ModRevision as this mover holds it
	src, dst *sgio.Client
	srcID    uint32
	dstID    uint32
	// srcLive: the source was live when this mover found it (not frozen by an earlier
	// one), so until its own freeze succeeds the owner may write it (endFlushUnfrozen).
	srcLive bool
}

func (m *mover) close() {
	if m.src != nil {
		m.src.Close()
	}
	if m.dst != nil {
		m.dst.Close()
	}
}

func (m *mover) errorf(format string, args ...any) error {
	return fmt.Errorf("node: move table %q partition %d: "+format, append([]any{m.t.m.Name, m.part}, args...)...)
}

func (m *mover) run(ctx context.Context, to string) error {
	c := m.t.n.c
	tm, err := m.t.n.readTable(ctx, m.t.m.Name)
	if err != nil {
		return m.errorf("read the map: %w", err)
	}
	rec, ok, err := c.ReadMove(ctx, m.t.m.Name, m.part)
	if err != nil {
		return m.errorf("%w", err)
	}
	if ok && rec.Created != tm.Created {
		// A move of a table dropped since (and created again): nothing of it is left to do.
		if _, err := c.EndMove(ctx, rec); err != nil {
			return m.errorf("%w", err)
		}
		ok = false
	}
	if !ok {
		if tm.Nodes[m.part] == to {
			return nil
		}
		rec = cluster.MoveRecord{Table: m.t.m.Name, Part: m.part, Created: tm.Created, Rev: tm.Revs[m.part], From: tm.Nodes[m.part], To: to}
	} else if rec.To != to {
		return m.errorf("%w: recorded from %s to %s, asked to %s", cluster.ErrMoveInProgress, rec.From, rec.To, to)
	}
	// Record the move, or adopt it (a retry), or take it over from a mover that died.
	rec.Lease = m.t.n.sess.Lease()
	rec, epoch, err := c.BeginMove(ctx, rec)
	if err != nil {
		return m.errorf("%w", err)
	}
	m.rec, m.epoch = rec, uint64(epoch)
	moveStep(MoveStepRecorded)
	if err := m.dial(ctx); err != nil {
		return err
	}
	switched := tm.Nodes[m.part] == rec.To
	if !switched && tm.Revs[m.part] != rec.Rev {
		// Switched elsewhere since the move began (by another mover's completed move): roll
		// back what this one did at the source.
		return m.rollback(ctx, fmt.Errorf("%w: the partition entry changed since the move began", cluster.ErrMapChanged))
	}
	if !switched {
		if err := m.copyAndSwitch(ctx); err != nil {
			return err
		}
	}
	return m.finish(ctx)
}

// dial connects to both storage nodes (as owner 0, like a resolver: the mover is no owner),
// with the operators' secret (Config.OperatorSecret), and opens the source's table.
func (m *mover) dial(ctx context.Context) error {
	cfg := m.t.n.cfg
	secret := cfg.OperatorSecret
	if len(secret) == 0 {
		secret = cfg.Secret
	}
	var err error
	if m.src, err = sgio.Dial(ctx, sgio.ClientConfig{Addr: m.rec.From, Secret: secret, Name: "mover", DialTimeout: cfg.DialTimeout}); err != nil {
		return m.errorf("source %s: %w", m.rec.From, err)
	}
	if m.dst, err = sgio.Dial(ctx, sgio.ClientConfig{Addr: m.rec.To, Secret: secret, Name: "mover", DialTimeout: cfg.DialTimeout}); err != nil {
		return m.errorf("target %s: %w", m.rec.To, err)
	}
	var ti sgio.TableInfo
	if err := m.src.CallInto(ctx, &sgio.OpenTable{Name: m.name}, &ti); err != nil {
		return m.errorf("source %s: %w", m.rec.From, err)
	}
	m.srcID = ti.Table
	return nil
}

func (m *mover) step(ctx context.Context, c *sgio.Client, op uint8, table uint32) (*sgio.MoveState, error) {
	return c.MoveStep(ctx, &sgio.Move{Op: op, Table: table})
}

// moveStepTries bounds the tries of a verified step the storage node could not verify
// (etcd slow or unreachable from it: sgio.ErrBusy); moveStepBackoff is the first wait
// between tries, doubled each time.
const (
	moveStepTries   = 4
	moveStepBackoff = 50 * time.Millisecond
)

// verified sends a move step the storage node verifies against etcd (begin, freeze, retire,
// activate, thaw; storenode's VerifyMoveStep), under this mover's epoch, trying again a
// bounded number of times while it answers that it could not verify it.
func (m *mover) verified(ctx context.Context, c *sgio.Client, mv *sgio.Move) (*sgio.MoveState, error) {
	mv.Token = m.epoch
	wait := moveStepBackoff
	for try := 1; ; try++ {
		st, err := c.MoveStep(ctx, mv)
		if err == nil || !errors.Is(err, sgio.ErrBusy) || try == moveStepTries {
			return st, err
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, err
		}
		wait *= 2
	}
}

// copyAndSwitch runs the steps up to the switch.
func (m *mover) copyAndSwitch(ctx context.Context) error {
	// The target's copy: created, or found incoming (a retry), or refused.
	var ti sgio.TableInfo
	l := m.t.m.Layout
	layout := base.ClusterLayout{Partitions: uint32(l.Partitions), StripePages: uint32(l.StripePages), Partition: m.part}
	err := m.dst.CallInto(ctx, &sgio.CreateClusterTable{RowBytes: uint16(m.t.rowBytes), Name: m.name, Layout: layout}, &ti)
	if errors.Is(err, storenode.ErrTableExists) {
		err = m.dst.CallInto(ctx, &sgio.OpenTable{Name: m.name}, &ti)
		if err == nil {
			err = m.dropRetired(ctx, &ti, layout)
		}
	}
	if err != nil {
		return m.errorf("target %s: %w", m.rec.To, err)
	}
	if ti.Cluster != layout || int(ti.RowBytes) != m.t.rowBytes {
		// A table of the name found there (a leftover of another table) with another layout
		// or row size: filled and switched to, the map would point at a copy it cannot open
		// (and whose ids are not the partition's stripes).
		return m.rollback(ctx, fmt.Errorf("%w: the target's table %q is %+v of %d-byte rows, the map says %+v of %d-byte rows",
			ErrMoveRefused, m.name, ti.Cluster, ti.RowBytes, layout, m.t.rowBytes))
	}
	m.dstID = ti.Table
	if _, err := m.verified(ctx, m.dst, &sgio.Move{Op: sgio.MoveOpBegin, Table: m.dstID}); err != nil {
		if errors.Is(err, sgio.ErrMalformed) {
			return m.rollback(ctx, fmt.Errorf("%w: the target's table %q is not a fresh copy: %w", ErrMoveRefused, m.name, err))
		}
		return m.errorf("target %s: %w", m.rec.To, err)
	}
	moveStep(MoveStepIncoming)

	// Copy, then catch up while the tail is long.
	st, err := m.step(ctx, m.src, sgio.MoveOpStatus, m.srcID)
	if err != nil {
		return m.errorf("source %s: %w", m.rec.From, err)
	}
	var token uint64
	m.srcLive = st.State == 0
	if st.State == 0 { // live: mark, copy, catch up
		if token, err = m.fullCopy(ctx); err != nil {
			return err
		}
		moveStep(MoveStepCopied)
		for range moveCatchUpRounds {
			n, err := m.catchUp(ctx, token, moveTailPages)
			if errors.Is(err, sgio.ErrMoveLost) {
				if token, err = m.fullCopy(ctx); err != nil {
					return err
				}
				continue
			}
			if err != nil {
				return err
			}
			if n <= moveTailPages {
				break
			}
		}
		moveStep(MoveStepCaughtUp)
	} else if st.State != uint8(storenode.MoveFrozen) {
		return m.errorf("source %s holds the partition %v", m.rec.From, storenode.MoveState(st.State))
	}
	// Frozen under this mover's epoch, a frozen source found (a mover that died, a rollback
	// cut short) too: the freeze taken over, so the late thaw of the mover that froze it
	// (its rollback, after its record was deleted) cannot undo this move's freeze.
	if err := m.ownerFlushed(ctx); err != nil {
		return err
	}
	if err := m.freeze(ctx, &token); err != nil {
		return err
	}
	moveStep(MoveStepFrozen)

	// Final catch-up: the source is frozen, so what it holds now is final.
	for {
		if token == 0 {
			if token, err = m.fullCopy(ctx); err != nil {
				return err
			}
		}
		n, err := m.catchUp(ctx, token, 0)
		if errors.Is(err, sgio.ErrMoveLost) {
			token = 0
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			break
		}
	}
	moveStep(MoveStepFinal)

	// The switch: the map entry unchanged since the start, the owner key unchanged since it
	// was read (a grant made meanwhile is refused by the frozen source anyway: read again).
	// The owner key stays: the owner's grant goes on at the target (finish's floor).
	for try := 0; ; try++ {
		h, held, err := m.t.n.c.Owner(ctx, m.t.m.Name, m.part)
		if err != nil {
			return m.errorf("%w", err)
		}
		var owner uint64
		if held {
			owner = h.Epoch
		}
		_, err = m.t.n.c.SwitchMoved(ctx, m.rec, owner)
		if err == nil {
			break
		}
		if !errors.Is(err, cluster.ErrMapChanged) || try >= 8 {
			return m.errorf("%w", err)
		}
		tm, rerr := m.t.n.readTable(ctx, m.t.m.Name)
		if rerr != nil {
			return m.errorf("read the map: %w", rerr)
		}
		if tm.Nodes[m.part] == m.rec.To {
			break // the switch went through; its answer was lost
		}
		if tm.Revs[m.part] != m.rec.Rev || tm.Created != m.rec.Created {
			return m.rollback(ctx, err)
		}
		if cur, ok, rerr := m.t.n.c.ReadMove(ctx, m.t.m.Name, m.part); rerr != nil {
			return m.errorf("%w", rerr)
		} else if !ok || cur != m.rec {
			return m.errorf("%w: the move record is not this mover's any more (another mover took it over)", cluster.ErrMoveInProgress)
		}
		// Only the owner key changed: read it again.
	}
	moveStep(MoveStepSwitched)
	return nil
}

// The wait of a freeze for the transactions in doubt at the source (mover.freeze): at most
// moveDoubtWaitMax from the first refusal, the freeze tried again after a random pause in
// [d/2, d), d = moveDoubtPauseMin doubling to moveDoubtPauseMax. A transaction in doubt is
// decided within a few round trips unless its coordinator died (then its storage node's
// resolver decides it once the coordinator's lease is gone): the bound lets a move wait out
// two-phase load, not a dead coordinator. Vars for tests.
var (
	moveDoubtWaitMax  = 10 * time.Second
	moveDoubtPauseMin = time.Millisecond
	moveDoubtPauseMax = 25 * time.Millisecond
)

// moveAfter is the timer of the freeze's pauses (time.NewTimer's channel and Stop; a test's
// fake one), moveNow its clock.
var (
	moveAfter = func(d time.Duration) (<-chan time.Time, func() bool) {
		t := time.NewTimer(d)
		return t.C, t.Stop
	}
	moveNow = time.Now
	// moveFlushWaitMax bounds the wait for the owner's flush before the freeze.
	moveFlushWaitMax = 10 * time.Second
)

// moveDoubtHook, set by tests only, hears each freeze refused for a transaction in doubt
// (the refusals so far), before the pause.
var moveDoubtHook func(refused int)

// dropRetired drops the target's table ti when it is the retired copy of an earlier move of
// the partition away from the target (a source fenced for good, serving nothing), and
// creates the fresh copy in its place, into ti: so a partition can move back to a storage
// node that once held it. The storage node drops a retired copy for anyone, unless etcd's
// map places the partition there (then it refuses, and so does this move). Any other table
// is left as it is (an incoming copy is reused; another is refused by the begin).
func (m *mover) dropRetired(ctx context.Context, ti *sgio.TableInfo, layout base.ClusterLayout) error {
	st, err := m.step(ctx, m.dst, sgio.MoveOpStatus, ti.Table)
	if err != nil || st.State != uint8(storenode.MoveRetired) {
		return err
	}
	if err := m.dst.CallInto(ctx, &sgio.DropTable{Name: m.name}, &sgio.OK{}); err != nil && !errors.Is(err, storenode.ErrTableNotFound) {
		return fmt.Errorf("drop the retired copy of an earlier move: %w", err)
	}
	return m.dst.CallInto(ctx, &sgio.CreateClusterTable{RowBytes: uint16(m.t.rowBytes), Name: m.name, Layout: layout}, ti)
}

// freeze freezes the source under this mover's epoch (a frozen source found is taken over).
// While a transaction in doubt holds rows of the partition there (storenode.ErrTxnLocked:
// the source cannot be frozen with a decision still to land on it), the move waits its turn:
// the freeze is tried again after a growing random pause, the source live and written
// meanwhile, a catch-up round before each try keeping the tail to copy while frozen short.
// Not held between tries: a freeze holding the partition's writes while it waited would fail
// them for as long as the slowest transaction in doubt (and, given up, leave its owner's
// tables fenced). Each refusal drains the source for storenode.MoveDrainFor instead: its
// new prepares are refused (not-owner, retried by their callers), its commits go on, so
// under steady two-phase load the transactions in doubt run out and a freeze gets in. Past moveDoubtWaitMax of refusals the move is rolled back: ErrMoveRefused,
// saying why. When ctx ends first the move stays recorded (the next Move resumes it).
func (m *mover) freeze(ctx context.Context, token *uint64) error {
	var first time.Time
	wait := moveDoubtPauseMin
	for refused := 1; ; refused++ {
		if err := ctx.Err(); err != nil {
			// Ended before this try (none sent; an earlier one was refused): live.
			m.endFlushUnfrozen(ctx)
			return m.errorf("freeze at %s: %w", m.rec.From, err)
		}
		_, err := m.verified(ctx, m.src, &sgio.Move{Op: sgio.MoveOpFreeze, Table: m.srcID})
		if err == nil {
			return nil
		}
		if !errors.Is(err, storenode.ErrTxnLocked) {
			return m.errorf("freeze at %s: %w", m.rec.From, err)
		}
		now := moveNow()
		if first.IsZero() {
			first = now
		}
		if waited := now.Sub(first); waited >= moveDoubtWaitMax {
			return m.rollback(ctx, fmt.Errorf("%w: transactions in doubt kept rows of the partition locked at the source %s for %v (%d freezes refused; a move waits at most %v for them to be decided): %w",
				ErrMoveRefused, m.rec.From, waited.Round(time.Millisecond), refused, moveDoubtWaitMax, err))
		}
		if h := moveDoubtHook; h != nil {
			h(refused)
		}
		c, stop := moveAfter(wait/2 + rand.N(wait/2+1))
		select {
		case <-c:
		case <-ctx.Done():
			stop()
			m.endFlushUnfrozen(ctx) // the last freeze was refused: the source is live
			return m.errorf("freeze at %s: %w (waiting for a transaction in doubt there to be decided: %w)", m.rec.From, ctx.Err(), err)
		}
		wait = min(2*wait, moveDoubtPauseMax)
		if *token == 0 {
			continue // a frozen source found: it has no mark (it is not refused either)
		}
		if _, err := m.catchUp(ctx, *token, moveTailPages); errors.Is(err, sgio.ErrMoveLost) {
			if *token, err = m.fullCopy(ctx); err != nil {
				return err
			}
		} else if err != nil {
			return err
		}
	}
}

// finish completes a switched move: the copy live at the grant floor (cluster.MoveFloor:
// the grant the switch kept is taken there, every grant ended before the switch is fenced),
// the source retired, the record gone. A copy found live was activated already (by this
// mover, or one that died after it): its floor is not set again.
func (m *mover) finish(ctx context.Context) error {
	tm, err := m.t.n.readTable(ctx, m.t.m.Name)
	if err != nil {
		return m.errorf("read the map: %w", err)
	}
	if tm.Nodes[m.part] != m.rec.To {
		return m.errorf("%w: the map points at %s, not the move's target %s", cluster.ErrMapChanged, tm.Nodes[m.part], m.rec.To)
	}
	if m.dstID == 0 {
		var ti sgio.TableInfo
		if err := m.dst.CallInto(ctx, &sgio.OpenTable{Name: m.name}, &ti); err != nil {
			return m.errorf("target %s: %w", m.rec.To, err)
		}
		m.dstID = ti.Table
	}
	dst, err := m.step(ctx, m.dst, sgio.MoveOpStatus, m.dstID)
	if err != nil {
		return m.errorf("target %s: %w", m.rec.To, err)
	}
	if dst.State != uint8(storenode.MoveLive) {
		floor, err := m.t.n.c.MoveFloor(ctx, m.rec)
		if err != nil {
			return m.errorf("%w", err)
		}
		st, err := m.step(ctx, m.src, sgio.MoveOpStatus, m.srcID)
		if err != nil {
			return m.errorf("source %s: %w", m.rec.From, err)
		}
		if _, err := m.verified(ctx, m.dst, &sgio.Move{Op: sgio.MoveOpActivate, Table: m.dstID, Floor: floor, NextID: st.NextID}); err != nil {
			return m.errorf("activate at %s: %w", m.rec.To, err)
		}
	}
	moveStep(MoveStepActivated)
	if _, err := m.verified(ctx, m.src, &sgio.Move{Op: sgio.MoveOpRetire, Table: m.srcID}); err != nil {
		return m.errorf("retire at %s: %w", m.rec.From, err)
	}
	moveStep(MoveStepRetired)
	if _, err := m.t.n.c.EndMove(ctx, m.rec); err != nil {
		return m.errorf("%w", err)
	}
	if err := m.t.n.c.EndFlush(ctx, m.t.m.Name, m.part, int64(m.epoch)); err != nil {
		return m.errorf("switched and done, but the owner's writes stay held until its flush request is ended (the next Move of the partition ends it): %w", err)
	}
	moveStep(MoveStepDone)
	return nil
}

// endFlushUnfrozen ends this mover's flush request when its ctx ended before its freeze and
// the source was live (not frozen by an earlier mover): the owner writes it again, as it
// would have without the request (the move stays recorded; the next Move asks again). Its
// own short context: the caller's has ended. Best effort: a request left stands until the
// next Move of the partition ends.
func (m *mover) endFlushUnfrozen(ctx context.Context) {
	if !m.srcLive {
		return
	}
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.t.n.cfg.OwnerLookupTimeout)
	defer cancel()
	if err := m.t.n.c.EndFlush(ectx, m.t.m.Name, m.part, int64(m.epoch)); err != nil {
		m.t.n.log.Warn("node: end a move's flush request", "table", m.t.m.Name, "part", m.part, "err", err)
	}
}

// ownerFlushed asks the partition's holder to flush and waits, at most moveFlushWaitMax,
// for its answer (cluster.RequestFlush; moveflush.go): a WriteBack owner's acknowledged
// writes are durable at the source before it freezes. No holder: none to wait for. No
// answer in time: the move rolls back (ErrMoveRefused, naming the holder).
func (m *mover) ownerFlushed(ctx context.Context) error {
	c := m.t.n.c
	if err := c.RequestFlush(ctx, m.rec, int64(m.epoch)); err != nil {
		return m.errorf("%w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, moveFlushWaitMax)
	err := c.WaitFlushed(wctx, m.t.m.Name, m.part, int64(m.epoch))
	cancel()
	switch {
	case err == nil:
		moveStep(MoveStepFlushed)
		return nil
	case ctx.Err() != nil:
		m.endFlushUnfrozen(ctx)
		return m.errorf("wait for the owner's flush: %w", err)
	}
	return m.rollback(ctx, fmt.Errorf("%w: the partition's owner did not flush its writes within %v: %w", ErrMoveRefused, moveFlushWaitMax, err))
}

// rollback undoes a move that did not switch: the record deleted (only if it is still this
// mover's: one that lost the move to another leaves everything to it), then the source thawed
// (writes again) unless the map points elsewhere; the target's incoming copy stays (serving
// nothing; a later move reuses it). A crash between the two leaves a frozen
// source without a record, which the next Move finishes. It returns cause.
func (m *mover) rollback(ctx context.Context, cause error) error {
	deleted, err := m.t.n.c.EndMove(ctx, m.rec)
	if err != nil {
		return m.errorf("%w (rolling back: %w)", cause, err)
	}
	if !deleted {
		return m.errorf("%w (the move record is not this mover's any more: nothing rolled back)", cause)
	}
	tm, err := m.t.n.readTable(ctx, m.t.m.Name)
	if err != nil {
		return m.errorf("%w (rolling back: read the map: %w)", cause, err)
	}
	if m.src != nil && m.srcID != 0 && tm.Created == m.rec.Created && tm.Nodes[m.part] == m.rec.From {
		st, err := m.step(ctx, m.src, sgio.MoveOpStatus, m.srcID)
		if err == nil && st.State == uint8(storenode.MoveFrozen) {
			// Under this mover's epoch: a successor's freeze (it began after this record
			// went) is of a higher one, and stays.
			_, err = m.verified(ctx, m.src, &sgio.Move{Op: sgio.MoveOpThaw, Table: m.srcID})
			if errors.Is(err, sgio.ErrFenced) {
				err = nil
			}
		}
		if err != nil {
			return m.errorf("%w (rolling back: thaw at %s: %w)", cause, m.rec.From, err)
		}
	}
	// The source is live (or not the map's): its owner writes it again.
	if err := m.t.n.c.EndFlush(ctx, m.t.m.Name, m.part, int64(m.epoch)); err != nil {
		return m.errorf("%w (rolling back: the owner's writes stay held until the next Move of the partition: %w)", cause, err)
	}
	return m.errorf("%w", cause)
}

// fullCopy marks the source and copies every page it holds, and clears every page the
// target holds that the source does not. It returns the mark's token.
func (m *mover) fullCopy(ctx context.Context) (uint64, error) {
	st, err := m.step(ctx, m.src, sgio.MoveOpMark, m.srcID)
	if err != nil {
		return 0, m.errorf("mark at %s: %w", m.rec.From, err)
	}
	srcPages, err := pageList(ctx, m.src, m.srcID)
	if err != nil {
		return 0, m.errorf("source %s: %w", m.rec.From, err)
	}
	// Pages the target holds that the source does not (rows deleted at the source while
	// a lost mark could not say so) are cleared.
	dstPages, err := pageList(ctx, m.dst, m.dstID)
	if err != nil {
		return 0, m.errorf("target %s: %w", m.rec.To, err)
	}
	var stale []base.Segment
	for _, p := range dstPages {
		if _, found := slices.BinarySearch(srcPages, p); !found {
			stale = append(stale, base.Segment{Table: m.dstID, RowBytes: uint16(m.t.rowBytes), Page: p, Clear: ^uint64(0)})
		}
	}
	for len(stale) > 0 {
		n := min(len(stale), 1024)
		w := &sgio.MoveWrite{Commit: sgio.Commit{Owner: 1, Seq: 1, Fences: []base.Fence{{Table: m.dstID, Epoch: m.epoch}}, Segments: stale[:n]}}
		if _, err := m.dst.WriteMove(ctx, w); err != nil {
			return 0, m.errorf("write at %s: %w", m.rec.To, err)
		}
		stale = stale[n:]
	}
	if err := m.copyPages(ctx, srcPages); err != nil {
		return 0, err
	}
	return st.Token, nil
}

// catchUp copies the pages written since the mark (in rounds of at most MovePagesMax) and
// returns how many it copied; it stops after more than limit (0: none) pages.
func (m *mover) catchUp(ctx context.Context, token uint64, limit int) (int, error) {
	total := 0
	for {
		st, err := m.src.MoveStep(ctx, &sgio.Move{Op: sgio.MoveOpChanges, Table: m.srcID, Token: token})
		if err != nil {
			return total, err
		}
		if err := m.copyPages(ctx, st.Pages); err != nil {
			return total, err
		}
		total += len(st.Pages)
		if !st.More || limit > 0 && total > limit {
			return total, nil
		}
	}
}

// copyPages reads pages from the source's durable rows (whole pages: present rows and the
// absent slots) and writes them to the target, in requests of about 1 MiB.
func (m *mover) copyPages(ctx context.Context, pages []uint64) error {
	per := max(1, (1<<20)/(64*m.t.rowBytes))
	for len(pages) > 0 {
		n := min(per, len(pages))
		rp := &sgio.ReadPages{Wants: make([]base.PageWant, n)}
		for i, p := range pages[:n] {
			rp.Wants[i] = base.PageWant{Table: m.srcID, Page: p, Want: ^uint64(0)}
		}
		var segs sgio.Segments
		if err := m.src.CallInto(ctx, rp, &segs); err != nil {
			return m.errorf("read at %s: %w", m.rec.From, err)
		}
		w := &sgio.MoveWrite{Commit: sgio.Commit{Owner: 1, Seq: 1, Fences: []base.Fence{{Table: m.dstID, Epoch: m.epoch}}}}
		for _, s := range segs.Segments {
			s.Table = m.dstID
			s.Rows = append([]byte(nil), s.Rows...)
			w.Segments = append(w.Segments, s)
		}
		if len(w.Segments) > 0 {
			if _, err := m.dst.WriteMove(ctx, w); err != nil {
				return m.errorf("write at %s: %w", m.rec.To, err)
			}
		}
		pages = pages[n:]
	}
	return nil
}

// pageList lists every page of a table that holds rows.
func pageList(ctx context.Context, c *sgio.Client, table uint32) ([]uint64, error) {
	var out []uint64
	lo := uint64(0)
	for {
		var r sgio.PageDirReply
		if err := c.CallInto(ctx, &sgio.PageDir{Table: table, Lo: lo, Hi: storenode.MaxRowID / 64}, &r); err != nil {
			return nil, err
		}
		for _, e := range r.Entries {
			out = append(out, e.Page)
		}
		if len(r.Entries) == 0 || r.Next >= storenode.MaxRowID/64 {
			return out, nil
		}
		lo = r.Next
	}
}
