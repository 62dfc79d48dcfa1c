package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/txnode"
	"github.com/weftdb/weft/txnode/txncoord"
)

// Table is a partitioned table as this node sees it: every partition's storage node (the
// partition map, followed as it changes: follow.go), the partitions this node owns and, for
// each, the transaction node's table it writes through. Row operations route by id
// (cluster.Layout.Of). After a partition switch (a move) the handle reads the partition
// from its new storage node and, if this node owned it, owns it again there; a dropped
// table's handle fails with cluster.ErrTableNotFound. Map returns the entry as read at open.
// Safe for concurrent use.
//
// Reads of a partition this node owns are served from its cache (txnode); reads of the others
// from the storage node's durable rows (txncoord.DurableTable), which may be older than what
// the owner's cache holds. Writes to a partition this node does not own fail with a
// *NotOwnerError naming the holder. Inserts go to the partitions this node owns, round robin.
type Table struct {
	n        *Node
	m        *cluster.TableMap
	rowBytes int
	parts    []part

	// owned lists the partitions whose tb is set (copy on write, changed by CAS: Insert
	// never waits for an Own in flight).
	owned atomic.Pointer[[]uint32]
	rr    atomic.Uint64

	// Following the map (follow.go): seen is the node's map snapshot the routes reflect
	// (an empty one at first); followMu serialises the updates; dropped is set once the
	// map no longer has the table (dropped, or dropped and created again).
	seen     atomic.Pointer[cluster.Map]
	followMu sync.Mutex
	dropped  atomic.Pointer[error]
}

// part is one partition: its storage node, the durable-read handle, and the owned table.
type part struct {
	// r is the partition's storage node and durable-read handle: replaced when the
	// partition moves (follow.go) or the storage node's transaction node is (heal.go).
	r atomic.Pointer[route]
	// tb is the transaction node's table while this node owns the partition; nil otherwise.
	tb atomic.Pointer[txnode.Table]
	// owning serialises Own of the partition (a one-slot semaphore: its wait honours the
	// caller's context; an OwnWait waiting out a holder holds up no other partition).
	owning chan struct{}
	// lost is set once the partition's grant was lost (released by Close, expired, taken,
	// released through another handle); Own may take it again (tableAfresh), under a new
	// grant, and clears it.
	lost atomic.Bool
	// rejoin is set when this node's owned table was dropped because the partition is being
	// moved (follow.go): once the map switches it, the node registers the session's grant
	// (the one the switch kept, or a new one) with its new storage node.
	rejoin atomic.Bool
	// released is set once this handle's Release gave the partition up (own.go); Own may
	// take it again, and clears it.
	released atomic.Bool
}

func newTable(n *Node, tm *cluster.TableMap, durable []*txncoord.DurableTable) *Table {
	t := &Table{n: n, m: tm, rowBytes: durable[0].RowBytes(), parts: make([]part, len(tm.Nodes))}
	for p := range t.parts {
		t.parts[p].r.Store(&route{addr: tm.Nodes[p], durable: durable[p], rev: revAt(tm, p)})
		t.parts[p].owning = make(chan struct{}, 1)
	}
	t.owned.Store(new([]uint32))
	t.seen.Store(&cluster.Map{})
	return t
}

// Name returns the table's name.
func (t *Table) Name() string { return t.m.Name }

// RowBytes returns the row size.
func (t *Table) RowBytes() int { return t.rowBytes }

// Layout returns the table's partition layout.
func (t *Table) Layout() cluster.Layout { return t.m.Layout }

// Map returns the table's partition map entry as this node read it (immutable).
func (t *Table) Map() *cluster.TableMap { return t.m }

// Partition returns row id's partition (cluster.Layout.Of).
func (t *Table) Partition(id uint64) uint32 { return t.m.Layout.Of(id) }

// NodeOf returns the address of the storage node of row id's partition (as this handle
// routes it now).
func (t *Table) NodeOf(id uint64) string { return t.parts[t.m.Layout.Of(id)].addr() }

// Owned returns the partitions this node owns, in the order Own took them. The slice is
// the caller's. A partition it does not list may be mid-move (owned again once the move's
// switch is followed), lost for good or released: OwnState tells them apart.
func (t *Table) Owned() []uint32 { return append([]uint32(nil), *t.owned.Load()...) }

// Own acquires partitions for writing under the node's session, at once: a partition another
// node holds fails with a *NotOwnerError naming it (the partitions before it stay owned); one
// the map no longer places where this handle routes it (switched, or the table dropped) fails
// with cluster.ErrMapChanged (two linearizable map reads per call, before the grants and
// after). Each
// grant is registered with the partition's storage node (which verifies it in etcd) before
// Own returns. Owning a partition already owned is a no-op. A partition this Node released
// or lost (OwnReleased, OwnLost), or owned before on a storage node it moved away from and
// back to, is owned again under a new grant (or the session's, if it still holds one): its
// transaction node forgets the table state it kept (tableAfresh), and its rows are read
// afresh from the storage node.
func (t *Table) Own(ctx context.Context, parts ...uint32) error { return t.own(ctx, false, parts) }

// OwnWait is Own waiting, for each partition, until its holder releases it or its lease
// expires (cluster.Session.AcquireWait), or ctx ends: how a node takes over the partitions of
// one that died. Calls of Own and OwnWait on different partitions proceed independently (an
// OwnWait waiting out a holder holds up no other partition); on the same partition one at a
// time, the others waiting within their contexts.
func (t *Table) OwnWait(ctx context.Context, parts ...uint32) error { return t.own(ctx, true, parts) }

func (t *Table) own(ctx context.Context, wait bool, parts []uint32) error {
	if err := t.n.closedErr(); err != nil {
		return err
	}
	var need []uint32
	for _, p := range parts {
		if p >= uint32(len(t.parts)) {
			return fmt.Errorf("node: %w: table %q has no partition %d", cluster.ErrInvalid, t.m.Name, p)
		}
		if tb := t.parts[p].tb.Load(); tb != nil && errors.Is(txncoord.Serving(tb), txnode.ErrForgotten) {
			// Released through another handle of this Node (its table forgotten, the
			// grant given up): not owned here any more; owned afresh below.
			t.drop(p)
		}
		if t.parts[p].tb.Load() == nil && !slices.Contains(need, p) {
			need = append(need, p)
		}
	}
	if len(need) == 0 {
		return nil
	}
	// The map is read once before the grants and once after (two linearizable reads per
	// call, whatever the number of partitions): a partition switched or a table dropped
	// before is refused before its grant is taken; after, the race with a switch that
	// happened meanwhile is refused too.
	if err := t.follow(ctx); err != nil {
		return t.n.after(err)
	}
	err := t.placed(ctx, need)
	if errors.Is(err, cluster.ErrMapChanged) && t.resync(ctx) == nil {
		err = t.placed(ctx, need) // the watcher was behind: moved, this handle follows it
	}
	if err != nil {
		return t.n.after(err)
	}
	if err := t.watcherAt(ctx, need); err != nil {
		return t.n.after(err)
	}
	took := make([]*txnode.Table, 0, len(need))
	for _, p := range need {
		var tb *txnode.Table
		if tb, err = t.ownOne(ctx, wait, p); err != nil {
			break
		}
		took = append(took, tb)
	}
	if len(took) > 0 {
		if perr := t.placed(ctx, need[:len(took)]); perr != nil {
			// Not owned through this handle (the grants stay with the transaction nodes
			// until the Node closes; an Own through a fresh handle takes them up).
			return t.n.after(perr)
		}
		if h := raceHook; h != nil {
			h("own")
		}
		for i, tb := range took {
			// A heal (heal.go) that replaced the storage node's transaction node between
			// the grant and here did not see the partition owned: register the grant (still
			// this session's) with its successor instead, a few times at most.
			for try := 0; txncoord.TableDB(tb) != t.n.current(t.parts[need[i]].addr()) && try < 3; try++ {
				var rerr error
				if tb, rerr = t.ownOne(ctx, wait, need[i]); rerr != nil {
					took, err = took[:i], rerr
					break
				}
			}
			if i >= len(took) {
				break
			}
			took[i] = tb
		}
		owned := make([]uint32, 0, len(took))
		for i, tb := range took {
			pt := &t.parts[need[i]]
			if tb = t.n.publish(t, need[i], pt.r.Load().rev, tb); tb == nil {
				// Placed afresh meanwhile (the map read above is behind a switch another
				// handle followed): not owned through this handle; the next call follows it.
				err = errors.Join(err, fmt.Errorf("node: own table %q partition %d: %w: it moved while it was owned here (run Own again)",
					t.m.Name, need[i], cluster.ErrMapChanged))
				continue
			}
			t.holdIfMoving(need[i], tb)
			pt.tb.Store(tb)
			pt.lost.Store(false)
			pt.released.Store(false)
			t.heldAfterStore(need[i], tb)
			owned = append(owned, need[i])
		}
		t.setOwned(owned...)
	}
	return t.n.after(err)
}

// watcherAt waits until the node's map watcher reflects the routes this handle has of
// partitions ps (bounded by OwnerLookupTimeout). A move's switch keeps the owner's grant, so
// a handle opened after the switch (its own linearizable read of the map) registers the very
// grant another handle of this node still holds at the frozen source, whose cached reads
// that handle serves until its next operation follows the switch, which it does only once
// the watcher delivers it: registered and written before, the write would be missed by the
// other handle's cached read (a stale read of an acknowledged write). After the wait every
// later operation of the other handles follows the switch first.
func (t *Table) watcherAt(ctx context.Context, ps []uint32) error {
	var rev int64
	for _, p := range ps {
		rev = max(rev, t.parts[p].r.Load().rev)
	}
	if t.n.w.Map().Revision >= rev {
		return nil
	}
	if h := raceHook; h != nil {
		h("own-watch")
	}
	wctx, cancel := context.WithTimeout(ctx, t.n.cfg.OwnerLookupTimeout)
	defer cancel()
	if _, err := t.n.w.WaitRevision(wctx, rev); err != nil {
		return fmt.Errorf("node: own table %q: the node's map watcher is behind this handle: %w", t.m.Name, err)
	}
	return nil
}

// raceHook, set by tests only, runs at the points a heal may race: in Own between the
// grants' map check and the store of the owned tables ("own"), in a move's follow between
// the dial of the new storage node and the route's store ("moved") and between the route's
// store and the owned table's registration ("moved-route"), and when the target refused
// the grant as not live yet, before it is asked again ("moved-incoming"), and in Own when
// the node's map watcher is behind the handle's routes, before it waits ("own-watch"), and
// when a write was refused with ErrMoved, before heldWrite tells whether it was held
// ("write-moved").
var raceHook func(where string)

// ownOne takes partition p's grant through its storage node's transaction node (own), one
// Own of it at a time, and returns the owned table.
func (t *Table) ownOne(ctx context.Context, wait bool, p uint32) (*txnode.Table, error) {
	pt := &t.parts[p]
	select {
	case pt.owning <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("node: own table %q partition %d: %w", t.m.Name, p, ctx.Err())
	}
	defer func() { <-pt.owning }()
	if tb := pt.tb.Load(); tb != nil {
		return tb, nil
	}
	db, err := t.n.db(ctx, pt.addr())
	if err != nil {
		return nil, err
	}
	gctx := context.WithValue(ctx, keepGrantKey{}, true)
	if wait {
		gctx = context.WithValue(gctx, waitKey{}, true)
	}
	pre := t.n.sess.Held(t.m.Name, p) != nil
	tb, err := t.tableAfresh(gctx, db, base.PartitionTableName(t.m.Name, p), 0)
	var oe *cluster.OwnedError
	switch {
	case errors.As(err, &oe):
		return nil, &NotOwnerError{Table: t.m.Name, Part: p, Held: true, Holder: oe.Holder}
	case errors.Is(err, txnode.ErrTableNotFound):
		return nil, fmt.Errorf("node: own table %q partition %d: not on storage node %s: %w (%w)", t.m.Name, p, pt.addr(), ErrIncomplete, err)
	case err != nil:
		if !pre || errors.Is(err, storenode.ErrMoved) {
			// Kept through the refusal (keepGrantKey: a move is recorded, whatever the
			// refusal was): nobody uses it. A grant the session held before this call
			// is left to its users, but for the move's refusal (as before).
			t.releaseUnused(p)
		}
		if errors.Is(err, cluster.ErrSessionClosed) {
			// The session grants nothing more: only a new one (a Node opened again) does.
			return nil, fmt.Errorf("node: own table %q partition %d: this node's session ended (%w): reopen the node to own it again", t.m.Name, p, err)
		}
		return nil, fmt.Errorf("node: own table %q partition %d on %s: %w", t.m.Name, p, pt.addr(), err)
	}
	if err := txncoord.Serving(tb); isLost(err) {
		// Lost again at once (tableAfresh opened it afresh): not owned.
		return nil, fmt.Errorf("node: table %q partition %d: this node's grant was lost (%w)", t.m.Name, p, err)
	}
	return tb, nil
}

// tableAfresh is db.Table(ctx, name): it opens a partition's table under the session's grant.
// A table state the transaction node kept from an earlier ownership whose grant ended (lost,
// fenced, released by another handle: isLost), or of a copy that is not the storage node's
// table now (a copy a move away retired there before the partition came back: its table
// there has another id than storeID, read now unless given, or is gone), is forgotten first
// (txncoord.Forget, the grant kept: holdGrantKey; its commits flushed, its frames
// dropped) and the table opened afresh, under the grant the session holds or a new one, its
// rows read again from the storage node. Without that the transaction node would keep the
// ended state for its life, and this Node could never own the partition again. The forget
// is of the very state db.Table returned (a concurrent one's fresh state is not forgotten).
func (t *Table) tableAfresh(ctx context.Context, db *txnode.DB, name string, storeID uint32) (*txnode.Table, error) {
	if storeID == 0 {
		d, err := txncoord.OpenDurable(ctx, db, name) // one read of the store's table list
		if err != nil {
			return nil, err
		}
		storeID = d.ID()
	}
	tb, err := db.Table(ctx, name)
	if err != nil {
		return nil, err
	}
	if serr := txncoord.Serving(tb); txncoord.TableID(tb) == storeID && !isLost(serr) && !errors.Is(serr, txnode.ErrTableNotFound) {
		return tb, nil
	}
	if err := txncoord.Forget(context.WithValue(ctx, holdGrantKey{}, true), tb); err != nil {
		return nil, fmt.Errorf("node: table %q: forget the table of an ended grant: %w", name, err)
	}
	return db.Table(ctx, name)
}

// placed checks, in one linearizable read of the map, that partitions ps are still where
// this handle routes them (the same table, the same storage nodes): a handle opened before a
// partition switch (a move) or a drop must not own the partition at its old place, where its
// writes would land unseen. cluster.ErrMapChanged otherwise (OpenTable the table again).
func (t *Table) placed(ctx context.Context, ps []uint32) error {
	tm, err := t.n.readTable(ctx, t.m.Name)
	switch {
	case errors.Is(err, cluster.ErrTableNotFound):
		return fmt.Errorf("node: own table %q: %w: the table was dropped (%w)", t.m.Name, cluster.ErrMapChanged, err)
	case err != nil:
		return fmt.Errorf("node: own table %q: read the partition map: %w", t.m.Name, err)
	}
	for _, p := range ps {
		if tm.Created != t.m.Created || int(p) >= len(tm.Nodes) || tm.Nodes[p] != t.parts[p].addr() {
			return fmt.Errorf("node: own table %q partition %d: %w: this handle routes it to %s, the map (revision %d) to %s: OpenTable it again",
				t.m.Name, p, cluster.ErrMapChanged, t.parts[p].addr(), tm.Created, nodeAt(tm, p))
		}
	}
	return nil
}

// revAt is partition p's entry revision in tm (0 when tm has none).
func revAt(tm *cluster.TableMap, p int) int64 {
	if p < len(tm.Revs) {
		return tm.Revs[p]
	}
	return 0
}

func nodeAt(tm *cluster.TableMap, p uint32) string {
	if int(p) < len(tm.Nodes) {
		return tm.Nodes[p]
	}
	return "(none)"
}

// isLost reports whether err says a partition's grant ended for good: cluster.ErrLost (the
// session closed, the lease expired, the owner key went), storenode.ErrFenced (the
// storage node refused it: a newer grant is registered there, which this node may not have
// heard of yet, cut off from etcd), or txnode.ErrForgotten (the table's state was forgotten:
// released through another handle, or taken up afresh by one: tableAfresh).
func isLost(err error) bool {
	return err != nil && (errors.Is(err, cluster.ErrLost) || errors.Is(err, storenode.ErrFenced) || errors.Is(err, txnode.ErrForgotten))
}

// gone reports whether err, of an operation on partition p's owned table, says p's grant
// ended for good: isLost, confirmed by the table itself (Serving). A transaction node's
// commit pipeline, once a batch failed, fails every later commit with that batch's error,
// fenced though only the batch's tables were: the others are not lost (and their holder is
// this node).
func (t *Table) gone(p uint32, err error) bool {
	if !isLost(err) {
		return false
	}
	tb := t.parts[p].tb.Load()
	return tb == nil || isLost(txncoord.Serving(tb))
}

// drop forgets partition p's ownership after its grant was lost.
func (t *Table) drop(p uint32) {
	pt := &t.parts[p]
	pt.lost.Store(true)
	if tb := pt.tb.Swap(nil); tb != nil {
		tb.Unpin() // its pages are no longer this node's to cache (pin.go)
	}
	t.unsetOwned(p)
}

// setOwned adds ps to the owned list (idempotent; one copy however many).
func (t *Table) setOwned(ps ...uint32) {
	for {
		cur := t.owned.Load()
		next := make([]uint32, 0, len(*cur)+len(ps))
		next = append(next, *cur...)
		in := make(map[uint32]bool, len(next))
		for _, q := range next {
			in[q] = true
		}
		for _, p := range ps {
			if !in[p] {
				in[p] = true
				next = append(next, p)
			}
		}
		if t.owned.CompareAndSwap(cur, &next) {
			return
		}
	}
}

// unsetOwned removes p from the owned list (idempotent).
func (t *Table) unsetOwned(p uint32) {
	for {
		cur := t.owned.Load()
		next := make([]uint32, 0, len(*cur))
		for _, q := range *cur {
			if q != p {
				next = append(next, q)
			}
		}
		if t.owned.CompareAndSwap(cur, &next) {
			return
		}
	}
}

// notOwner is the error of an access to partition p that this node does not own, naming its
// holder from etcd (Client.Owner, linearizable).
func (t *Table) notOwner(ctx context.Context, p uint32) error {
	ctx, cancel := context.WithTimeout(ctx, t.n.cfg.OwnerLookupTimeout)
	defer cancel()
	h, ok, err := t.n.c.Owner(ctx, t.m.Name, p)
	if err != nil {
		return &NotOwnerError{Table: t.m.Name, Part: p, Lookup: err}
	}
	return &NotOwnerError{Table: t.m.Name, Part: p, Held: ok, Holder: h}
}

// written is the error of a write to partition p through the owned table: a lost grant
// becomes a *NotOwnerError (the partition is forgotten as owned).
func (t *Table) written(ctx context.Context, p uint32, err error) error {
	return t.writtenTo(ctx, p, t.parts[p].tb.Load(), t.n.heldSince(), err)
}

// writtenTo is written of a write through owned table tb, begun at since (heldSince): a
// write held for a move becomes a *NotOwnerError too (heldWrite).
func (t *Table) writtenTo(ctx context.Context, p uint32, tb *txnode.Table, since uint64, err error) error {
	if herr, ok := t.heldWrite(p, tb, since, err); ok {
		return herr
	}
	if !t.gone(p, err) {
		return t.n.after(t.n.noteErr(t.parts[p].addr(), err))
	}
	if t.movedAway(ctx, p, err) {
		// Switched away under the write (refused, never acknowledged): the partition is
		// routed to its new storage node now, owned there again if that worked: retry.
		ne := &NotOwnerError{Table: t.m.Name, Part: p, Held: t.parts[p].tb.Load() != nil}
		if ne.Held {
			ne.Holder = t.n.sess.Holder()
		}
		return fmt.Errorf("%w (moved to %s during the write: retry it; this node's grant: %w)", ne, t.parts[p].addr(), err)
	}
	if t.moving(ctx, p, err) {
		ne := &NotOwnerError{Table: t.m.Name, Part: p, Held: true, Holder: t.n.sess.Holder()}
		return fmt.Errorf("%w (being moved: this node owns it again once it is switched; retry: %w)", ne, err)
	}
	t.drop(p)
	ne := t.notOwner(ctx, p)
	return fmt.Errorf("%w (this node's grant: %w)", ne, err)
}

// Get copies row id into dst (len(dst) == RowBytes). A partition this node owns is read
// through its cache; any other from its storage node's durable rows, possibly older than
// the owner's cache. txnode.ErrNotFound when there is no such row.
func (t *Table) Get(ctx context.Context, id uint64, dst []byte) error {
	if err := t.n.closedErr(); err != nil {
		return err
	}
	p := t.m.Layout.Of(id)
	pt := &t.parts[p]
	if err := t.follow(ctx); err != nil {
		return t.n.after(err)
	}
	if err := t.heal(ctx, p); err != nil {
		return t.n.after(err)
	}
	if tb := pt.tb.Load(); tb != nil {
		err := tb.Get(ctx, id, dst)
		if !t.gone(p, err) {
			return t.n.after(t.n.noteErr(pt.addr(), err))
		}
		if t.movedAway(ctx, p, err) {
			return t.Get(ctx, id, dst) // once: the routes are current
		}
		if !t.moving(ctx, p, err) {
			t.drop(p)
		}
	}
	r := pt.r.Load()
	err := r.durable.Get(ctx, id, dst)
	if err != nil && t.movedAway(ctx, p, err) {
		err = pt.r.Load().durable.Get(ctx, id, dst)
	}
	return t.n.after(t.n.noteErr(r.addr, err))
}

// Insert adds a row under a new id in one of the partitions this node owns (round robin over
// them: each Insert the next one) and returns the id (see txnode.Table.Insert for the
// outcomes). Without an owned partition it fails with ErrNotOwner. A partition whose grant
// is lost is skipped (and forgotten as owned).
func (t *Table) Insert(ctx context.Context, row []byte) (uint64, error) {
	if err := t.n.closedErr(); err != nil {
		return 0, err
	}
	if err := t.follow(ctx); err != nil {
		return 0, t.n.after(err)
	}
	for tried := 1; ; {
		owned := *t.owned.Load()
		if len(owned) == 0 {
			return 0, fmt.Errorf("%w: this node owns no partition of table %q (Table.Own or OwnWait the partitions it writes first)", ErrNotOwner, t.m.Name)
		}
		p := owned[t.rr.Add(1)%uint64(len(owned))]
		if err := t.heal(ctx, p); err != nil {
			return 0, t.n.after(err)
		}
		tb := t.parts[p].tb.Load()
		if tb == nil {
			t.unsetOwned(p) // dropped meanwhile: its drop removes it too
			continue
		}
		since := t.n.heldSince()
		id, err := tb.Insert(ctx, row)
		if herr, held := t.heldWrite(p, tb, since, err); held {
			if len(owned) > 1 && tried < len(owned) {
				tried++
				continue // another owned partition takes it
			}
			return 0, herr
		}
		if t.gone(p, err) {
			if !t.movedAway(ctx, p, err) && !t.moving(ctx, p, err) {
				t.drop(p)
			}
			continue
		}
		return id, t.n.after(t.n.noteErr(t.parts[p].addr(), err))
	}
}

// owner returns the owned table of row id's partition, or the *NotOwnerError.
func (t *Table) owner(ctx context.Context, id uint64) (uint32, *txnode.Table, error) {
	p := t.m.Layout.Of(id)
	if err := t.n.closedErr(); err != nil {
		return p, nil, err
	}
	if err := t.follow(ctx); err != nil {
		return p, nil, t.n.after(err)
	}
	if err := t.heal(ctx, p); err != nil {
		return p, nil, t.n.after(err)
	}
	if tb := t.parts[p].tb.Load(); tb != nil {
		return p, tb, nil
	}
	if t.parts[p].rejoin.Load() && t.resync(ctx) == nil {
		// Lost to a move (follow.go): switched by now, it is owned again.
		if tb := t.parts[p].tb.Load(); tb != nil {
			return p, tb, nil
		}
	}
	return p, nil, t.notOwner(ctx, p)
}

// Update calls fn with a copy of row id and writes what fn leaves in it (txnode.Table.Update),
// in a partition this node owns (*NotOwnerError otherwise).
func (t *Table) Update(ctx context.Context, id uint64, fn func(row []byte) error) error {
	p, tb, err := t.owner(ctx, id)
	if err != nil {
		return err
	}
	since := t.n.heldSince()
	return t.writtenTo(ctx, p, tb, since, tb.Update(ctx, id, fn))
}

// Put replaces row id (txnode.Table.Put), in a partition this node owns.
func (t *Table) Put(ctx context.Context, id uint64, row []byte) error {
	p, tb, err := t.owner(ctx, id)
	if err != nil {
		return err
	}
	since := t.n.heldSince()
	return t.writtenTo(ctx, p, tb, since, tb.Put(ctx, id, row))
}

// Delete deletes row id (txnode.Table.Delete), in a partition this node owns.
func (t *Table) Delete(ctx context.Context, id uint64) error {
	p, tb, err := t.owner(ctx, id)
	if err != nil {
		return err
	}
	since := t.n.heldSince()
	return t.writtenTo(ctx, p, tb, since, tb.Delete(ctx, id))
}
