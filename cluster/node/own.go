package node

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/txnode"
	"github.com/weftdb/weft/txnode/txncoord"
)

// Ownership of a partition, as a Table knows it (OwnState): the owned table (part.tb), and
// the flags of a partition not owned now (part.rejoin: dropped because it is being moved,
// owned again once the map switches it; part.lost: its grant ended for good; part.released:
// given up by this handle's Release). At most one of the three flags is set while tb is nil;
// tb set implies none of them but rejoin, which the follow clears as it stores the new table
// (an Own clears lost and released as it stores it).

// OwnState is what this node knows of its ownership of one partition (Table.OwnState).
type OwnState uint8

const (
	// OwnNone: not owned, and nothing keeps this node from owning it (Own may take it):
	// never owned through this handle, or given up after a move this node could not
	// follow (the target refused its grant: follow.go).
	OwnNone OwnState = iota
	// OwnHeld: owned (listed by Table.Owned); writes go through this node's cache.
	OwnHeld
	// OwnMoving: owned, but being moved: a write found the frozen source (or a fence while
	// a move of the partition is recorded in etcd), so the partition is not listed by
	// Owned, and its writes fail with a *NotOwnerError to retry. The node keeps the grant
	// (the switch keeps it) and owns the partition again, under the same grant, once the
	// map switches it (the next operation of the handle follows): OwnHeld then, or OwnNone
	// if the new storage node refused the grant.
	OwnMoving
	// OwnLost: the grant ended for good: the session's lease expired or the session closed,
	// the owner key went, or a storage node fenced it (another node's newer grant), or
	// another handle of this Node released it. Its writes fail with a *NotOwnerError naming
	// the new holder. Own may take it again under a new grant (the session's, if it lives:
	// a closed or expired session grants nothing more), once nobody else holds it.
	OwnLost
	// OwnReleased: given up by this handle's Table.Release. Own may take it again, once
	// nobody else holds it.
	OwnReleased
)

// String returns the state's name.
func (s OwnState) String() string {
	switch s {
	case OwnNone:
		return "none"
	case OwnHeld:
		return "held"
	case OwnMoving:
		return "moving"
	case OwnLost:
		return "lost"
	case OwnReleased:
		return "released"
	}
	return fmt.Sprintf("OwnState(%d)", uint8(s))
}

// OwnState returns what this handle knows of the node's ownership of partition p (OwnState):
// tells a partition mid-move (OwnMoving: owned again once the move's switch is followed)
// from one lost for good (OwnLost: fenced, expired, taken by another node) or given up
// (OwnReleased, by this handle), neither of which Owned lists. It reflects what this handle's operations
// found, reading nothing: a grant lost that no operation has run into yet is still
// OwnHeld, and a partition whose move froze it before any write found out is OwnHeld until
// one does. OwnNone for a partition the table does not have. Any goroutine may call it.
func (t *Table) OwnState(p uint32) OwnState {
	if p >= uint32(len(t.parts)) {
		return OwnNone
	}
	pt := &t.parts[p]
	switch {
	case pt.tb.Load() != nil:
		return OwnHeld
	case pt.released.Load():
		return OwnReleased
	case pt.lost.Load():
		return OwnLost
	case pt.rejoin.Load():
		return OwnMoving
	}
	return OwnNone
}

// Release gives up partitions parts without closing the Node, each in turn: it stops this
// handle's writes of the partition (later ones fail with a *NotOwnerError naming the new
// holder, or nobody), waits until every commit the partition's transaction node admitted
// before is durable at its storage node (in WriteBack mode it asks for a flush: the
// acknowledged commits not flushed yet are written first, so the next owner reads them),
// then releases the grant: its owner key is deleted in etcd, so another node's Own of the
// partition succeeds at once (its newer grant replaces this one at the storage node, which
// verifies it in etcd), not a lease later. A partition being moved (OwnMoving) has its grant
// released too, and is not owned again after the switch.
//
// Releasing a partition this handle does not own (OwnNone, OwnLost, OwnReleased) is a
// no-op; one the table does not have is cluster.ErrInvalid (nothing released). The grant
// is the Node's, shared by its handles of the table: another handle that owns the partition
// loses it too (OwnLost). The partition's transaction node forgets its table
// (txncoord.Forget: its cached rows, its pin, its state), so a later Own of it, through
// any handle of this Node, takes a new grant and reads the rows afresh from the storage
// node: players move between servers and back.
//
// Writes of the partition still running when Release starts (begun before it, on this
// handle or in a Node.Update) are not waited for: one that commits before the flush is
// written with it, one that commits after fails (its grant gone), or, in WriteBack mode,
// may be acknowledged and lost with its epoch. Stop writing a partition before releasing it.
//
// When the wait fails (ctx ends, the transaction node failed) the partition stays owned,
// and Release returns that error, wrapped; when etcd refuses the release, the partition is
// released here but its owner key stays until the session's lease ends (the grant stopped
// vouching: this node serves it no more). The partitions before it stay released.
func (t *Table) Release(ctx context.Context, parts ...uint32) error {
	if err := t.n.closedErr(); err != nil {
		return err
	}
	for _, p := range parts {
		if p >= uint32(len(t.parts)) {
			return fmt.Errorf("node: %w: table %q has no partition %d", cluster.ErrInvalid, t.m.Name, p)
		}
	}
	var done []uint32
	for _, p := range parts {
		if slices.Contains(done, p) {
			continue
		}
		if err := t.releaseOne(ctx, p); err != nil {
			return t.n.after(err)
		}
		done = append(done, p)
	}
	return nil
}

// releaseOne is Release of partition p, one Own or Release of it at a time (owning).
func (t *Table) releaseOne(ctx context.Context, p uint32) error {
	pt := &t.parts[p]
	if err := ctx.Err(); err != nil { // ended before: nothing released (the select picks at random)
		return fmt.Errorf("node: release table %q partition %d: %w", t.m.Name, p, err)
	}
	select {
	case pt.owning <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("node: release table %q partition %d: %w", t.m.Name, p, ctx.Err())
	}
	defer func() { <-pt.owning }()
	tb := pt.tb.Load()
	if tb == nil && !pt.rejoin.Load() {
		return nil
	}
	// Writes of this handle are refused from here (owner: not owned, not to rejoin), and a
	// move's follow does not own it again (movedOn: no table, no rejoin).
	pt.released.Store(true)
	rejoin := pt.rejoin.Swap(false)
	if tb != nil {
		if !pt.tb.CompareAndSwap(tb, nil) {
			// A write found the grant lost meanwhile (drop, moving): owned no more.
			tb = nil
		}
		t.unsetOwned(p)
	}
	if tb != nil {
		// Forgotten (txnode: closed to commits, flushed, its frames and pin dropped) before
		// the grant's release, which the forget leaves to this node (holdGrantKey): an
		// acknowledged write is durable first, and nothing of this node's reaches the
		// storage node under the grant after it. A ctx that ends during the flush forgets
		// nothing (the grant's release would fail): kept.
		err := txncoord.Forget(context.WithValue(ctx, holdGrantKey{}, true), tb)
		if errors.Is(err, txnode.ErrClosed) || errors.Is(err, txnode.ErrFailStop) {
			// Its transaction node is dead (closed by a heal, or failed for good): nothing
			// of it can be flushed any more (Durable: its acknowledged commits are in the
			// storage node's WAL; WriteBack: lost with it, as in a crash, and logged by the
			// heal), and its successor never had the partition. The grant goes.
			err = nil
		}
		if err != nil {
			pt.released.Store(false)
			pt.rejoin.Store(rejoin)
			if pt.tb.CompareAndSwap(nil, tb) { // the same table: held already if a move asked
				t.setOwned(p)
			}
			return fmt.Errorf("node: release table %q partition %d: its commits are not durable yet: %w (still owned)", t.m.Name, p, err)
		}
	}
	// The grant is the Node's: every other handle of the table loses the partition too
	// (OwnLost), the table it holds (forgotten) and its rejoin at a move's switch alike, or
	// its follow or a heal would take the grant again.
	for _, h := range t.n.liveHandles(t.m.Name) {
		if h != t && h.m.Created == t.m.Created && int(p) < len(h.parts) {
			h.parts[p].rejoin.Store(false)
			if h.parts[p].tb.Load() != nil {
				h.drop(p)
			}
		}
	}
	if o := t.n.sess.Held(t.m.Name, p); o != nil {
		if err := o.Release(ctx); err != nil {
			return fmt.Errorf("node: release table %q partition %d: %w (not served here any more; its owner key stays until it is deleted or the session's lease ends)",
				t.m.Name, p, err)
		}
	}
	return nil
}
