package node

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/txnode"
	"github.com/weftdb/weft/txnode/txncoord"
)

// Tx is a transaction over the partitions this node owns, on any number of storage nodes
// (Node.Update, read-write; Node.View, read-only). Every row it touches must be in a
// partition this node owns (a read of any other is ErrNotOwner too: serializability cannot be
// kept over rows another node may be changing). It is valid only while its closure runs, on
// the closure's goroutine.
type Tx struct {
	n        *Node
	ctx      context.Context
	writable bool
	// parts are the storage nodes touched, in the order of first touch: each one's
	// transaction node transaction, begun when the first row there is touched.
	parts []*txPart
	// writers are the parts written, in the order of their first write: participant i of a
	// two-phase commit is writers[i], the primary writers[0].
	writers []*txPart
	// err is the first routing failure (ErrNotOwner, ...): every later access returns it,
	// and Update returns it whatever the closure does with it.
	err  error
	done bool
	// touched lists the partitions the transaction routed to (the commit's lost grant is
	// told by them).
	touched []touch
	// turn is the run's cache turn (nil until a part was first sent back for it): each part
	// begun runs with it when it holds that part's storage node's turn.
	turn *txncoord.CacheTurn
	// heldSince is the Node's heldSince as the run began (heldWrite).
	heldSince uint64
}

// txPart is the transaction's part on one storage node.
type txPart struct {
	addr  string
	db    *txnode.DB
	tx    *txnode.Tx
	wrote bool
}

// touch is one partition a transaction routed to, the storage node it was routed to, and
// the owned table that served it: the rows it read were validated against that table's cache.
type touch struct {
	t    *Table
	p    uint32
	addr string
	tb   *txnode.Table
}

// Update runs fn in a read-write transaction over owned partitions on any storage nodes and
// commits it atomically, retrying on conflict (up to txnode.DefaultMaxRetries times): fn may
// run more than once and must have no other effects. fn runs once per attempt; each storage
// node's transaction node transaction is begun when fn first touches a row there.
//
// Rows on one storage node commit as one txnode transaction (one commit batch). Rows written
// on several, or written on one and read on others, commit with two-phase commit
// (docs/cluster.md, "Two-phase commit"): nil is returned only once the primary recorded the
// commit; an error wrapping txnode.ErrUnknownOutcome when that could not be learned before
// ctx ended (the storage nodes' resolvers, and this node in the background until Close,
// finish the transaction either way: all of it or none). A row of a partition this node does
// not own is a *NotOwnerError; Update returns that error even if fn did not. A grant lost
// before the commit (txnode checks every touched partition's grant again then) fails the
// commit with a *NotOwnerError too, and so does a two-phase commit's prepare refused because a
// partition is being moved (txnode.ErrMoved: retry; the partition stays owned). Any other
// failed prepare aborts the transaction: its error matches ErrAborted (and the refusal, such
// as txnode.ErrTxnBusy), never txnode.ErrUnknownOutcome: nothing of it was applied. A panic
// in fn rolls the attempt back and goes on up.
// A commit refused because a storage node holds a row in doubt for another transaction
// (txnode.ErrTxnLocked) is run again after a growing pause, for about 10 s at most, within
// ctx; only then is ErrTxnLocked returned.
//
// As txnode.DB.Update, fn's own error is returned only once what fn read is durable (Durable
// mode; if a batch it read from failed, fn runs again; if ctx ends first, ctx's error).
// As it too, a part that needs a page while its cache is full and it holds others is run
// again after the attempt was rolled back and parked for that cache's turn
// (txncoord.CacheTurn, one turn held at a time), for at most txnode.Options.CacheWait in all;
// then Update returns txnode.ErrCacheFull.
func (n *Node) Update(ctx context.Context, fn func(tx *Tx) error) error {
	return n.run(ctx, true, fn)
}

// View runs fn in a read-only transaction, as Update does (a write in it is
// txnode.ErrReadOnly): each storage node's reads are validated once fn returned, so all of
// them held at one moment: serializable across storage nodes (every read precedes every
// validation, and a row a two-phase commit changes stays locked from its prepare until it is
// installed, so a validation fails across it). A partition this node does not own is
// ErrNotOwner in it too (Table.Get reads such a row outside any transaction, from its
// durable rows).
func (n *Node) View(ctx context.Context, fn func(tx *Tx) error) error {
	return n.run(ctx, false, fn)
}

func (n *Node) run(ctx context.Context, writable bool, fn func(tx *Tx) error) error {
	var turn *txncoord.CacheTurn // as txnode.DB.Update's loop: taken when a part is sent back
	defer func() {
		if turn != nil {
			turn.Release()
		}
	}()
	locked := 0 // the attempts refused with ErrTxnLocked
	for attempt := 0; ; attempt++ {
		if err := n.closedErr(); err != nil {
			return err
		}
		tx := &Tx{n: n, ctx: ctx, writable: writable, turn: turn, heldSince: n.heldSince()}
		err := runBody(tx, fn)
		tx.done = true
		if tx.err != nil {
			err = tx.err
		} else if busy := tx.cacheBusy(); busy != nil {
			// A part needed a page while its cache was full and it held others (its calls
			// failed with ErrCacheFull, whatever fn made of them): every part rolled back,
			// parked for that cache's turn, run again (not counted as a conflict's retry).
			for _, pt := range tx.parts {
				if pt.tx != busy {
					pt.tx.Rollback()
				}
			}
			if turn == nil {
				turn = new(txncoord.CacheTurn)
			}
			if werr := turn.Wait(busy); werr != nil {
				busy.Rollback()
				return n.after(werr)
			}
			attempt--
			continue
		}
		if err != nil {
			// fn's own error may rest on reads a concurrent commit changed (they are no
			// snapshot): then it runs again, as for a conflict.
			// A routing conflict (a partition's table replaced during the transaction)
			// is one too.
			conflict := errors.Is(tx.err, txnode.ErrConflict) || tx.anyConflict()
			if !conflict && tx.err == nil {
				// As txnode.DB.Update: fn's own error is returned only once what fn read is
				// durable; a read from a batch that failed never happened: run again.
				if werr := tx.waitReads(); errors.Is(werr, txnode.ErrConflict) {
					conflict = true
				} else if werr != nil {
					err = werr
				}
			}
			tx.rollback()
			if conflict && attempt < txnode.DefaultMaxRetries {
				continue
			}
			return n.after(tx.mapLost(err))
		}
		err = tx.commit()
		if isLost(err) && !errors.Is(err, txnode.ErrUnknownOutcome) {
			// Refused (nothing of it applied) for a grant a touched table lost, while that
			// table was replaced (a move's source fenced under it, then followed): a
			// conflict, run again through the table that serves the partition now.
			if serr := tx.stillServed(); serr != nil {
				err = fmt.Errorf("%w (%w)", serr, err)
			}
		}
		if errors.Is(err, txnode.ErrTxnLocked) && locked < lockedRetries && ctx.Err() == nil {
			// A storage node holds a row in doubt for another transaction (its decision not
			// applied there yet): documented as retryable, so retried here, boundedly, with
			// a growing random pause (not counted as a conflict's retry).
			locked++
			if !pause(ctx, lockedPause(locked)) {
				return n.after(err)
			}
			attempt--
			continue
		}
		if errors.Is(err, txnode.ErrConflict) && attempt < txnode.DefaultMaxRetries {
			if len(tx.writers) > 0 && len(tx.parts) > 1 && attempt > 0 {
				// Two-phase commits whose prepares collided (each holding rows the other
				// wants) would collide again if both ran again at once: a random pause,
				// growing with the attempts (at most conflictPauseMax).
				pause(ctx, conflictPause(attempt))
			}
			continue
		}
		return n.after(tx.mapLost(err))
	}
}

// runBody runs fn; a panic rolls every part back and goes on up.
func runBody(tx *Tx, fn func(*Tx) error) error {
	ok := false
	defer func() {
		if !ok {
			tx.done = true
			tx.rollback()
		}
	}()
	err := fn(tx)
	ok = true
	return err
}

// anyConflict reports whether a part's reads changed (the closure's error may come from it).
func (tx *Tx) anyConflict() bool {
	for _, pt := range tx.parts {
		if errors.Is(txncoord.Validate(pt.tx), txnode.ErrConflict) {
			return true
		}
	}
	return false
}

// waitReads waits until every part's reads are durable (txncoord.WaitReads).
func (tx *Tx) waitReads() error {
	for _, pt := range tx.parts {
		if err := txncoord.WaitReads(pt.tx); err != nil {
			return err
		}
	}
	return nil
}

// cacheBusy returns the first part sent back for the cache turn (txncoord.CacheBusy), or nil.
func (tx *Tx) cacheBusy() *txnode.Tx {
	for _, pt := range tx.parts {
		if txncoord.CacheBusy(pt.tx) {
			return pt.tx
		}
	}
	return nil
}

func (tx *Tx) rollback() {
	for _, pt := range tx.parts {
		pt.tx.Rollback()
	}
}

// mapLost maps a lost grant the commit found to the partition's *NotOwnerError.
func (tx *Tx) mapLost(err error) error {
	if isLost(err) && !errors.Is(err, ErrNotOwner) {
		return tx.lostAtCommit(err)
	}
	return err
}

// lostAtCommit maps a lost grant the commit found (txnode checks every touched table's grant
// again at commit) to the *NotOwnerError of the first touched partition whose grant is gone,
// as a write refused on the spot is (the partition is forgotten as owned).
func (tx *Tx) lostAtCommit(err error) error {
	for _, since := range [2]uint64{tx.n.heldSince(), tx.heldSince} { // held now first, then a hold ended since
		for _, u := range tx.touched {
			if herr, ok := u.t.heldWrite(u.p, u.t.parts[u.p].tb.Load(), since, err); ok {
				return herr
			}
		}
	}
	for _, u := range tx.touched {
		if tb := u.t.parts[u.p].tb.Load(); tb != nil && isLost(txncoord.Serving(tb)) {
			return u.t.written(tx.ctx, u.p, err)
		}
	}
	return err
}

// movedAtPrepare maps a two-phase commit whose prepare the storage node at addr refused
// because a partition there is being moved (txnode.ErrMoved: a source frozen for the move's
// final catch-up, or a copy moved away) to that partition's *NotOwnerError, wrapping err (the
// definite abort: ErrAborted, ErrMoved): the game retries, as after a write refused by a
// move (Table.written). The partition stays owned: a refused prepare ends no grant, and the
// switch keeps the grant (the Table follows the map and registers it with the new copy).
func (tx *Tx) movedAtPrepare(addr string, err error) error {
	u, ok := tx.movingAt(addr)
	if !ok {
		return err
	}
	t, p := u.t, u.p
	if t.parts[p].addr() != addr || t.movedAway(tx.ctx, p, err) {
		ne := &NotOwnerError{Table: t.m.Name, Part: p, Held: t.parts[p].tb.Load() != nil}
		if ne.Held {
			ne.Holder = t.n.sess.Holder()
		}
		return fmt.Errorf("%w (moved to %s during the two-phase commit: retry it: %w)", ne, t.parts[p].addr(), err)
	}
	ne := &NotOwnerError{Table: t.m.Name, Part: p, Held: true, Holder: t.n.sess.Holder()}
	return fmt.Errorf("%w (being moved: this node owns it again once it is switched; retry: %w)", ne, err)
}

// movingAt returns the touched partition the transaction routed to the storage node at addr
// that a move concerns: of several there, the first with a move recorded in etcd (else the
// first).
func (tx *Tx) movingAt(addr string) (touch, bool) {
	var at []touch
	for _, u := range tx.touched {
		if u.addr == addr {
			at = append(at, u)
		}
	}
	switch len(at) {
	case 0:
		return touch{}, false
	case 1:
		return at[0], true
	}
	for _, u := range at {
		ctx, cancel := context.WithTimeout(tx.ctx, u.t.n.cfg.OwnerLookupTimeout)
		_, ok, err := u.t.n.c.ReadMove(ctx, u.t.m.Name, u.p)
		cancel()
		if err == nil && ok {
			return u, true
		}
	}
	return at[0], true
}

// commit commits the parts: nothing touched, nothing to do; one storage node, its one-batch
// Commit; else the read-only parts validated and the written ones by two-phase commit.
func (tx *Tx) commit() error {
	switch {
	case len(tx.parts) == 0:
		return nil
	case len(tx.parts) == 1:
		if err := tx.parts[0].tx.Commit(); err != nil || len(tx.writers) > 0 {
			// Written: validated inside the commit, where a table replaced meanwhile was
			// superseded before its successor was stored (publish.go): a read of it fails
			// the validation there. Checked here, after the commit, it could not be undone.
			return err
		}
		return tx.stillServed()
	case len(tx.writers) == 0:
		for i, pt := range tx.parts {
			if err := pt.tx.Commit(); err != nil {
				for _, rest := range tx.parts[i+1:] {
					rest.tx.Rollback()
				}
				return err
			}
		}
		return tx.stillServed()
	}
	return tx.n.twoPhase(tx)
}

// route returns the owned table of partition p of t and the transaction of its storage
// node (begun on first use), or the error.
func (tx *Tx) route(t *Table, p uint32, write bool) (*txnode.Tx, *txnode.Table, error) {
	if tx.done {
		return nil, nil, txnode.ErrTxDone
	}
	if tx.err != nil {
		return nil, nil, tx.err
	}
	if t.n != tx.n {
		tx.err = fmt.Errorf("node: %w: table %q was opened by another Node than the transaction's", cluster.ErrInvalid, t.m.Name)
		return nil, nil, tx.err
	}
	if err := t.follow(tx.ctx); err != nil {
		tx.err = err
		return nil, nil, err
	}
	if err := t.heal(tx.ctx, p); err != nil {
		tx.err = err
		return nil, nil, err
	}
	pt := &t.parts[p]
	tb := pt.tb.Load()
	if tb == nil {
		tx.err = t.notOwner(tx.ctx, p)
		return nil, nil, tx.err
	}
	var part *txPart
	for _, x := range tx.parts {
		if x.addr == pt.addr() {
			part = x
			break
		}
	}
	if part == nil {
		db, err := tx.n.db(tx.ctx, pt.addr())
		if err == nil && len(tx.parts) >= maxParticipants {
			err = fmt.Errorf("node: %w: a transaction spans at most %d storage nodes", cluster.ErrInvalid, maxParticipants)
		}
		var ttx *txnode.Tx
		if err == nil {
			ttx, err = db.Begin(tx.ctx, tx.writable)
		}
		if err == nil && tx.turn != nil {
			tx.turn.Hold(ttx)
		}
		if err != nil {
			tx.err = err
			return nil, nil, err
		}
		part = &txPart{addr: pt.addr(), db: db, tx: ttx}
		tx.parts = append(tx.parts, part)
	}
	if txncoord.TableDB(tb) != part.db {
		// The storage node's transaction node was replaced (heal.go) between the owned
		// table's load and the transaction's: a conflict (nothing was written), so Update
		// runs the transaction again, on the new one.
		if tb = pt.tb.Load(); tb == nil || txncoord.TableDB(tb) != part.db {
			tx.err = fmt.Errorf("node: table %q partition %d: %w: the transaction node of storage node %s was replaced during the transaction",
				t.m.Name, p, txnode.ErrConflict, pt.addr())
			return nil, nil, tx.err
		}
	}
	if write && tx.writable && !part.wrote {
		part.wrote = true
		tx.writers = append(tx.writers, part)
	}
	if i := slices.IndexFunc(tx.touched, func(u touch) bool { return u.t == t && u.p == p }); i < 0 {
		tx.touched = append(tx.touched, touch{t, p, part.addr, tb})
	} else if !txncoord.Same(tx.touched[i].tb, tb) {
		tx.err = tx.touched[i].replaced()
		return nil, nil, tx.err
	}
	return part.tx, tb, nil
}

// replaced is the conflict of a transaction whose partition is served by another owned
// table than the one it first touched (moved, healed onto a new transaction node, owned
// again): what it read there was validated against a cache nothing writes any more, so its
// reads may be stale. Update runs the transaction again.
func (u touch) replaced() error {
	return fmt.Errorf("node: table %q partition %d: %w: its owned table was replaced during the transaction (moved, healed or owned again)",
		u.t.m.Name, u.p, txnode.ErrConflict)
}

// stillServed checks, once the transaction's reads are validated, that every partition it
// touched is still served by the owned table that served it (a handle of its state):
// validated there, the reads were current at validation (every write of a partition goes
// through the table serving it). The conflict of the first one replaced, else nil.
func (tx *Tx) stillServed() error {
	for _, u := range tx.touched {
		if !txncoord.Same(u.t.parts[u.p].tb.Load(), u.tb) {
			return u.replaced()
		}
	}
	return nil
}

// maxParticipants is the two-phase commit's bound on participants (sgio.TxnParticipantsMax).
const maxParticipants = 64

// failed maps an error of the storage node's transaction: a lost grant becomes a
// *NotOwnerError (and the partition is forgotten as owned), kept as the transaction's error.
func (tx *Tx) failed(t *Table, p uint32, err error) error {
	if !t.gone(p, err) {
		return err
	}
	tx.err = t.written(tx.ctx, p, err)
	return tx.err
}

// Get copies row id of t into dst; it sees the transaction's own writes.
func (tx *Tx) Get(t *Table, id uint64, dst []byte) error {
	p := t.m.Layout.Of(id)
	ttx, tb, err := tx.route(t, p, false)
	if err != nil {
		return err
	}
	return tx.failed(t, p, ttx.Get(tb, id, dst))
}

// Update calls fn with a copy of row id of t and writes what fn leaves in it.
func (tx *Tx) Update(t *Table, id uint64, fn func(row []byte) error) error {
	p := t.m.Layout.Of(id)
	ttx, tb, err := tx.route(t, p, true)
	if err != nil {
		return err
	}
	return tx.failed(t, p, ttx.Update(tb, id, fn))
}

// Put replaces row id of t.
func (tx *Tx) Put(t *Table, id uint64, row []byte) error {
	p := t.m.Layout.Of(id)
	ttx, tb, err := tx.route(t, p, true)
	if err != nil {
		return err
	}
	return tx.failed(t, p, ttx.Put(tb, id, row))
}

// Delete deletes row id of t.
func (tx *Tx) Delete(t *Table, id uint64) error {
	p := t.m.Layout.Of(id)
	ttx, tb, err := tx.route(t, p, true)
	if err != nil {
		return err
	}
	return tx.failed(t, p, ttx.Delete(tb, id))
}

// Insert adds a row to t in a partition this node owns (round robin over them, whatever
// their storage nodes) and returns its id. ErrNotOwner when this node owns no partition of t.
func (tx *Tx) Insert(t *Table, row []byte) (uint64, error) {
	if tx.done {
		return 0, txnode.ErrTxDone
	}
	if tx.err != nil {
		return 0, tx.err
	}
	if t.n != tx.n {
		tx.err = fmt.Errorf("node: %w: table %q was opened by another Node than the transaction's", cluster.ErrInvalid, t.m.Name)
		return 0, tx.err
	}
	owned := *t.owned.Load()
	if len(owned) == 0 {
		tx.err = fmt.Errorf("%w: this node owns no partition of table %q (Table.Own or OwnWait the partitions it writes first)", ErrNotOwner, t.m.Name)
		return 0, tx.err
	}
	p := owned[t.rr.Add(1)%uint64(len(owned))]
	ttx, tb, err := tx.route(t, p, true)
	if err != nil {
		return 0, err
	}
	id, err := ttx.Insert(tb, row)
	return id, tx.failed(t, p, err)
}

// lockedRetries bounds the attempts Update makes again after a commit refused with
// txnode.ErrTxnLocked (rows in doubt at a storage node); lockedPauseMax bounds the pause before
// each (lockedPause). With the defaults, Update gives up (returning ErrTxnLocked) after about
// 10 s of refusals, or when ctx ends. Vars for tests.
var (
	lockedRetries  = 64
	lockedPauseMax = 250 * time.Millisecond
)

// lockedPause is a random pause in [d/2, d), d = 1ms doubling with the attempts up to
// lockedPauseMax.
func lockedPause(attempt int) time.Duration {
	d := min(time.Millisecond<<min(attempt-1, 20), lockedPauseMax)
	return d/2 + rand.N(d/2+1)
}

// conflictPauseMax bounds the pause before a two-phase commit runs again after a conflict.
const conflictPauseMax = 5 * time.Millisecond

// conflictPause is a random pause in [0, min(attempt * 200µs, conflictPauseMax)).
func conflictPause(attempt int) time.Duration {
	return rand.N(min(time.Duration(attempt)*200*time.Microsecond, conflictPauseMax))
}
