package node

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/txnode"
)

// Tx is a transaction over the partitions this node owns on one storage node (Node.Update,
// read-write; Node.View, read-only). Every row it touches must be in a partition this node owns (a read of any
// other is ErrNotOwner too: serializability cannot be kept over rows another node may be
// changing), all on one storage node (ErrCrossNode otherwise). It is valid only while its
// closure runs, on the closure's goroutine.
type Tx struct {
	n   *Node
	ctx context.Context
	// probe: the run that only finds the storage node (see Node.Update); every access
	// after the first returns errBind.
	probe bool
	addr  string     // the storage node, once known
	db    *txnode.DB // its transaction node
	tx    *txnode.Tx // nil in the probe
	// err is the first routing failure (ErrNotOwner, ErrCrossNode, errBind): every later
	// access returns it, and Update returns it whatever the closure does with it.
	err  error
	done bool
	// touched lists the partitions the transaction routed to (the commit's lost grant is
	// told by them).
	touched []touch
}

// touch is one partition a transaction routed to.
type touch struct {
	t *Table
	p uint32
}

// errBind ends the probe run: the transaction's storage node is known.
var errBind = errors.New("node: transaction bound to its storage node (internal)")

// Update runs fn in a read-write transaction on one storage node and commits it as one
// txnode transaction (one commit batch: atomic, serializable), retrying on conflict as
// txnode.DB.Update does: fn may run more than once and must have no other effects.
//
// The storage node is the one of the first row fn touches (or, for a first Insert, of the
// partition it goes to): to learn it, fn first runs up to that access, which returns an
// internal error (whatever fn does with it, that run is discarded), then runs again inside
// the storage node's transaction (a panic of fn in that first run, once the storage node is
// known, is dropped: fn runs again). A row of a partition this node does not own is a
// *NotOwnerError; one on another storage node is ErrCrossNode; Update returns that error
// even if fn did not. A grant lost before the commit (txnode checks every touched
// partition's grant again then) fails the commit with a *NotOwnerError too. Atomic
// transactions over several storage nodes come with two-phase commit (docs/cluster.md).
func (n *Node) Update(ctx context.Context, fn func(tx *Tx) error) error {
	return n.run(ctx, true, fn)
}

// View runs fn in a read-only transaction on one storage node, as Update does (a write in
// it is txnode.ErrReadOnly): its reads of owned partitions are validated at the end, so they
// are one consistent state. A partition this node does not own is ErrNotOwner in it too
// (Table.Get reads such a row outside any transaction, from its durable rows).
func (n *Node) View(ctx context.Context, fn func(tx *Tx) error) error {
	return n.run(ctx, false, fn)
}

func (n *Node) run(ctx context.Context, writable bool, fn func(tx *Tx) error) error {
	if err := n.closedErr(); err != nil {
		return err
	}
	probe := &Tx{n: n, ctx: ctx, probe: true}
	err := probeRun(probe, fn)
	switch {
	case probe.err == nil:
		return err // fn touched no row: nothing to commit
	case probe.err != errBind:
		return probe.err
	}
	db := probe.db
	var last *Tx
	body := func(t *txnode.Tx) error {
		tx := &Tx{n: n, ctx: ctx, addr: probe.addr, db: db, tx: t}
		last = tx
		err := fn(tx)
		tx.done = true
		if tx.err != nil {
			return tx.err
		}
		return err
	}
	if !writable {
		err = db.View(ctx, body)
	} else {
		err = db.Update(ctx, body)
	}
	if isLost(err) && last != nil && !errors.Is(err, ErrNotOwner) {
		err = last.lostAtCommit(err)
	}
	return n.after(err)
}

// lostAtCommit maps a lost grant the commit found (txnode checks every touched table's grant
// again at commit) to the *NotOwnerError of the first touched partition whose grant is gone,
// as a write refused on the spot is (the partition is forgotten as owned).
func (tx *Tx) lostAtCommit(err error) error {
	for _, u := range tx.touched {
		if tb := u.t.parts[u.p].tb.Load(); tb != nil && isLost(tb.Serving()) {
			return u.t.written(tx.ctx, u.p, err)
		}
	}
	return err
}

// probeRun runs fn in the probe. A panic after the probe bound the transaction (fn panicked
// on the internal error, or on what followed from it) is dropped: the run is discarded
// anyway, and the real run reproduces any panic of fn's own. Any other goes on up.
func probeRun(probe *Tx, fn func(*Tx) error) (err error) {
	defer func() {
		probe.done = true
		if r := recover(); r != nil {
			if probe.err != errBind {
				panic(r)
			}
			err = nil
		}
	}()
	return fn(probe)
}

// route returns the owned table of partition p of t for this transaction, or the error.
func (tx *Tx) route(t *Table, p uint32) (*txnode.Table, error) {
	if tx.done {
		return nil, txnode.ErrTxDone
	}
	if tx.err != nil {
		return nil, tx.err
	}
	if t.n != tx.n {
		tx.err = fmt.Errorf("node: %w: table %q was opened by another Node than the transaction's", cluster.ErrInvalid, t.m.Name)
		return nil, tx.err
	}
	pt := &t.parts[p]
	tb := pt.tb.Load()
	if tb == nil {
		tx.err = t.notOwner(tx.ctx, p)
		return nil, tx.err
	}
	if tx.probe {
		db, err := t.n.db(tx.ctx, pt.addr)
		if err != nil {
			tx.err = err
			return nil, err
		}
		tx.addr, tx.db, tx.err = pt.addr, db, errBind
		return nil, errBind
	}
	if pt.addr != tx.addr {
		tx.err = fmt.Errorf("%w: table %q partition %d is on storage node %s, the transaction's rows on %s",
			ErrCrossNode, t.m.Name, p, pt.addr, tx.addr)
		return nil, tx.err
	}
	if !slices.Contains(tx.touched, touch{t, p}) {
		tx.touched = append(tx.touched, touch{t, p})
	}
	return tb, nil
}

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
	tb, err := tx.route(t, p)
	if err != nil {
		return err
	}
	return tx.failed(t, p, tx.tx.Get(tb, id, dst))
}

// Update calls fn with a copy of row id of t and writes what fn leaves in it.
func (tx *Tx) Update(t *Table, id uint64, fn func(row []byte) error) error {
	p := t.m.Layout.Of(id)
	tb, err := tx.route(t, p)
	if err != nil {
		return err
	}
	return tx.failed(t, p, tx.tx.Update(tb, id, fn))
}

// Put replaces row id of t.
func (tx *Tx) Put(t *Table, id uint64, row []byte) error {
	p := t.m.Layout.Of(id)
	tb, err := tx.route(t, p)
	if err != nil {
		return err
	}
	return tx.failed(t, p, tx.tx.Put(tb, id, row))
}

// Delete deletes row id of t.
func (tx *Tx) Delete(t *Table, id uint64) error {
	p := t.m.Layout.Of(id)
	tb, err := tx.route(t, p)
	if err != nil {
		return err
	}
	return tx.failed(t, p, tx.tx.Delete(tb, id))
}

// Insert adds a row to t in a partition this node owns on the transaction's storage node
// (round robin over them), and returns its id. As the transaction's first access it picks
// among every owned partition (round robin), and so the storage node. ErrNotOwner when this
// node owns no partition of t; ErrCrossNode when it owns none on the transaction's storage
// node.
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
		tx.err = fmt.Errorf("%w: this node owns no partition of table %q", ErrNotOwner, t.m.Name)
		return 0, tx.err
	}
	start := t.rr.Add(1)
	for i := range uint64(len(owned)) {
		p := owned[(start+i)%uint64(len(owned))]
		if !tx.probe && t.parts[p].addr != tx.addr {
			continue
		}
		tb, err := tx.route(t, p)
		if err != nil {
			return 0, err
		}
		id, err := tx.tx.Insert(tb, row)
		return id, tx.failed(t, p, err)
	}
	tx.err = fmt.Errorf("%w: this node owns no partition of table %q on storage node %s", ErrCrossNode, t.m.Name, tx.addr)
	return 0, tx.err
}
