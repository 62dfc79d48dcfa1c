package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/txnode"
	"github.com/weftdb/weft/txnode/txncoord"
)

// A Table follows the partition map (the Node's cluster.MapWatcher): each operation first
// compares the watcher's snapshot with the one its routes reflect (one pointer compare when
// nothing changed) and, when the map changed, brings the routes up to date (refollow):
//
//   - a partition switched to another storage node (a move) is read from the new one's
//     durable rows; if this node owned it, it still does: the switch keeps the owner key
//     (ownership never changes hands at a switch), so the session's Acquire returns the same
//     grant, which the node registers with the new storage node (its floor is just below the
//     grant's epoch: cluster.MoveFloor). A target not activated yet refuses it with
//     storenode.ErrMoved; the grant is kept (keepGrantKey) and the target asked again a few
//     times (followActivateTries). When that fails the grant is released and the partition
//     reported not owned (*NotOwnerError; Own may take it again). Until the follow, the
//     owner's cached reads of the partition stay correct (nobody else can write it: the
//     frozen source refuses every commit, and no other node can hold a grant for the
//     target) and its writes fail (the frozen source's storenode.ErrMoved);
//   - a table dropped (or dropped and created again) fails every operation of the handle
//     with cluster.ErrTableNotFound.
//
// The watcher may be behind etcd: a write of an owned partition that finds its grant lost,
// and a durable read refused by a moved copy (storenode.ErrMoved), sync the watcher
// (linearizable) before they decide. A write refused at the switch fails with a
// *NotOwnerError (never acknowledged, so nothing acknowledged is lost): retry it.

// route is a partition's storage node and its durable-read handle there.
type route struct {
	addr    string
	durable *txncoord.DurableTable
	// rev is the partition entry's etcd revision this route follows (cluster.TableMap.Revs):
	// a map snapshot older than it (a watcher behind the handle's own read) changes nothing.
	rev int64
}

func (pt *part) addr() string { return pt.r.Load().addr }

// follow brings t's routes up to the node's map snapshot (see above).
func (t *Table) follow(ctx context.Context) error {
	m := t.n.w.Map()
	if m != t.seen.Load() {
		if err := t.refollow(ctx, m); err != nil {
			// A moved partition's new storage node not reachable yet: the routes stay
			// as they were (the old copy refuses what it no longer serves) and the next
			// operation tries again.
			t.n.log.Warn("node: following the partition map", "table", t.m.Name, "err", err)
		}
	}
	if e := t.dropped.Load(); e != nil {
		return *e
	}
	return nil
}

// resync reads etcd's map revision and waits for the watcher to reach it, then follows it:
// what an operation refused by its storage node does before it decides.
func (t *Table) resync(ctx context.Context) error {
	sctx, cancel := context.WithTimeout(ctx, t.n.cfg.OwnerLookupTimeout)
	m, err := t.n.w.Sync(sctx)
	cancel()
	if err != nil {
		return fmt.Errorf("node: table %q: read the partition map: %w", t.m.Name, err)
	}
	if err := t.refollow(ctx, m); err != nil {
		return err
	}
	if e := t.dropped.Load(); e != nil {
		return *e
	}
	return nil
}

// refollow updates the routes to map snapshot m (when newer than the one they reflect).
func (t *Table) refollow(ctx context.Context, m *cluster.Map) error {
	t.followMu.Lock()
	defer t.followMu.Unlock()
	if seen := t.seen.Load(); seen == m || seen.Revision > m.Revision {
		return nil
	}
	if m.Revision < t.m.Created {
		return nil // a snapshot from before the table: the watcher is behind this handle
	}
	tm, err := m.Table(t.m.Name)
	if err == nil && tm.Created < t.m.Created {
		return nil // behind too: an older table of the name
	}
	if err == nil && tm.Created != t.m.Created {
		err = fmt.Errorf("%w: %q was dropped and created again (revision %d, this handle's %d): OpenTable it again",
			cluster.ErrTableNotFound, t.m.Name, tm.Created, t.m.Created)
	}
	if errors.Is(err, cluster.ErrTableNotFound) {
		e := fmt.Errorf("node: table %q was dropped: %w", t.m.Name, err)
		t.dropped.CompareAndSwap(nil, &e)
		t.n.unpublishDropped(t)
		t.seen.Store(m)
		return nil
	}
	if err != nil {
		return fmt.Errorf("node: table %q: %w", t.m.Name, err)
	}
	var errs []error
	for p := range t.parts {
		r := t.parts[p].r.Load()
		if tm.Revs[p] <= r.rev {
			continue
		}
		// Switched since this route, to another storage node, or back to this one (moved
		// away and back while this handle did nothing): its table there is a fresh copy.
		// One that cannot be followed now (its new storage node down) does not keep the
		// others from being followed.
		if err := t.moved(ctx, uint32(p), tm.Nodes[p], tm.Revs[p]); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...) // not seen yet: the next operation tries the rest again
	}
	t.seen.Store(m)
	return nil
}

// resyncPart is resync for partition p alone: nil once p's route follows etcd's map as of
// the read (another partition it could not follow, its new storage node down, is that
// partition's operations' concern).
func (t *Table) resyncPart(ctx context.Context, p uint32) error {
	sctx, cancel := context.WithTimeout(ctx, t.n.cfg.OwnerLookupTimeout)
	m, err := t.n.w.Sync(sctx)
	cancel()
	if err != nil {
		return fmt.Errorf("node: table %q: read the partition map: %w", t.m.Name, err)
	}
	err = t.refollow(ctx, m)
	if err == nil {
		return nil
	}
	tm, terr := m.Table(t.m.Name)
	if terr != nil || tm.Created != t.m.Created || tm.Revs[p] <= t.parts[p].r.Load().rev {
		return nil // p's route is current (or the table is gone: nothing to follow)
	}
	return err
}

// moved routes partition p to storage node to, switched there at revision switchRev, and
// acquires it anew there if this node owned it.
// A heal of the storage node's transaction node between the dial and the end (heal.go's
// reown did not see the new route or table) is done again on its successor, a few times at
// most.
func (t *Table) moved(ctx context.Context, p uint32, to string, switchRev int64) error {
	for try := 0; ; try++ {
		db, err := t.movedOn(ctx, p, to, switchRev, try == 2)
		if err != nil || db == t.n.current(to) || try == 2 {
			return err
		}
	}
}

// movedOn is one try of moved, on the transaction node it returns (not the last: an owned
// partition whose grant that transaction node, replaced meanwhile, failed to register stays
// to rejoin on the next try).
func (t *Table) movedOn(ctx context.Context, p uint32, to string, switchRev int64, last bool) (*txnode.DB, error) {
	pt := &t.parts[p]
	name := base.PartitionTableName(t.m.Name, p)
	db, err := t.n.db(ctx, to)
	if err != nil {
		return nil, err
	}
	d, err := txncoord.OpenDurable(ctx, db, name)
	if err != nil {
		return nil, fmt.Errorf("node: table %q partition %d moved to %s: %w", t.m.Name, p, to, err)
	}
	if h := raceHook; h != nil {
		h("moved")
	}
	pt.r.Store(&route{addr: to, durable: d, rev: switchRev})
	if h := raceHook; h != nil {
		h("moved-route")
	}
	was := pt.tb.Load()
	if was == nil && !pt.rejoin.Load() {
		return db, nil
	}
	// Owned: the grant the switch kept is registered with the target (the session's
	// Acquire returns it as it is). One Own of the partition at a time (owning).
	select {
	case pt.owning <- struct{}{}:
	case <-ctx.Done():
		t.forget(p, was)
		return db, nil
	}
	defer func() { <-pt.owning }()
	var tb *txnode.Table
	tctx := context.WithValue(ctx, keepGrantKey{}, true)
	wait := coordRetry
	for try := 0; ; try++ {
		// Afresh: a table state this transaction node kept from an earlier ownership of the
		// partition here (moved away and back) is forgotten first (tableAfresh).
		if tb, err = t.tableAfresh(tctx, db, name, d.ID()); err == nil {
			err = txncoord.Serving(tb)
		}
		if !errors.Is(err, storenode.ErrMoved) || try == followActivateTries {
			break
		}
		// The target refused the grant as not live: the switch is done, its activation
		// (the mover's next step) not yet. Asked again a few times (a mover that died
		// there leaves it incoming until the next Move: then forgotten below).
		if h := raceHook; h != nil {
			h("moved-incoming")
		}
		if !pause(ctx, wait) {
			break
		}
		wait = min(2*wait, time.Second)
	}
	if err != nil && !last && db != t.n.current(to) {
		return db, nil // replaced meanwhile: the next try, on its successor
	}
	if err != nil {
		t.n.log.Warn("node: an owned partition moved; owning it again on its new storage node failed",
			"table", t.m.Name, "part", p, "to", to, "err", err)
		if was != nil {
			t.n.unpublish(t, p, was) // the source's: it serves the partition no more
		}
		t.forget(p, was)
		return db, nil
	}
	if tb = t.n.publish(t, p, switchRev, tb); tb == nil {
		return db, nil // published at a later placement by another handle: followed next
	}
	t.holdIfMoving(p, tb)
	if pt.tb.CompareAndSwap(was, tb) {
		t.heldAfterStore(p, tb)
		if was != nil {
			was.Unpin()
		}
		pt.rejoin.Store(false)
		pt.lost.Store(false)
		t.setOwned(p)
	}
	return db, nil
}

// followActivateTries bounds the grants a move's follow registers again with a target that
// refused one as not live yet (storenode.ErrMoved: switched, not activated), coordRetry
// doubling to a second between them (about 3 s in all).
const followActivateTries = 8

// forget drops partition p's old owned table was, as not owned (not lost: Own may take it
// again), and releases the session's grant of it (the switch kept it) unless another handle
// of this node uses it (releaseUnused).
func (t *Table) forget(p uint32, was *txnode.Table) {
	t.parts[p].rejoin.Store(false)
	if was != nil && t.parts[p].tb.CompareAndSwap(was, nil) {
		was.Unpin()
		t.unsetOwned(p)
	}
	t.releaseUnused(p)
}

// releaseUnused releases the session's grant of partition p unless a handle of this node
// uses it: t owns it (a concurrent follow or Own took it meanwhile) or is to own it again
// after a move (rejoin), or another live handle owns it or is to. A grant kept through a
// refused registration (keepGrantKey) that nothing uses would keep every other node from
// the partition until this node's session ends.
func (t *Table) releaseUnused(p uint32) {
	if pt := &t.parts[p]; pt.tb.Load() != nil || pt.rejoin.Load() || t.n.ownedElsewhere(t, p) {
		return
	}
	if o := t.n.sess.Held(t.m.Name, p); o != nil {
		ctx, cancel := context.WithTimeout(context.Background(), t.n.cfg.OwnerLookupTimeout)
		if err := o.Release(ctx); err != nil {
			t.n.log.Warn("node: release of an unused grant", "table", t.m.Name, "part", p, "err", err)
		}
		cancel()
	}
}

// moving reports whether owned partition p, whose grant an operation found lost (err), is
// being moved (the storage node refused it with storenode.ErrMoved, or a move is recorded
// in etcd): then it is forgotten as owned but not lost, and acquired
// anew on its new storage node once the map switches it (rejoin).
func (t *Table) moving(ctx context.Context, p uint32, err error) bool {
	if !errors.Is(err, storenode.ErrMoved) {
		// Fenced otherwise: by another owner, or while a move of the partition runs (a
		// grant lost meanwhile, or a storage node's fence during it). A move recorded
		// says which.
		mctx, cancel := context.WithTimeout(ctx, t.n.cfg.OwnerLookupTimeout)
		_, ok, rerr := t.n.c.ReadMove(mctx, t.m.Name, p)
		cancel()
		if rerr != nil || !ok {
			return false
		}
	}
	pt := &t.parts[p]
	pt.rejoin.Store(true)
	if was := pt.tb.Load(); was != nil && pt.tb.CompareAndSwap(was, nil) {
		was.Unpin()
		t.unsetOwned(p)
	}
	return true
}

// movedAway reports whether partition p, whose operation failed with err (a lost grant, or
// the storage node's ErrMoved), was moved: the map read afresh routes it elsewhere now.
func (t *Table) movedAway(ctx context.Context, p uint32, err error) bool {
	if !isLost(err) && !errors.Is(err, storenode.ErrMoved) {
		return false
	}
	before := t.parts[p].addr()
	if t.resync(ctx) != nil {
		return false
	}
	return t.parts[p].addr() != before
}

// ownedElsewhere reports whether a live Table handle of this node other than t, of the same
// table, owns partition p or is to own it again after a move (rejoin).
func (n *Node) ownedElsewhere(t *Table, p uint32) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, w := range n.handles {
		o := w.Value()
		if o == nil || o == t || o.m.Name != t.m.Name || o.m.Created != t.m.Created || int(p) >= len(o.parts) {
			continue
		}
		if o.parts[p].tb.Load() != nil || o.parts[p].rejoin.Load() {
			return true
		}
	}
	return false
}
