package storenode

import (
	"fmt"
	"math/bits"
	"time"

	"github.com/weftdb/weft/base"
)

// Ownership and id grants. One owner (a transaction node) writes a table at a time. A grant is
// (owner, epoch): the epoch is bumped and logged, synced, on every grant, and every commit
// batch presents the epoch of each table it writes, so a cut-off old owner is fenced. Leases
// live in memory only: after a restart every holder's lease starts afresh, so a new owner can
// never be granted a table before an old owner's lease could have run out.
//
// Renewals take no mu (RenewGrant, Renew): leases, holders and epochs are also guarded by
// leaseMu (see Engine), so a checkpoint or a stream of commits holding mu never delays one,
// and a storage node's event loop may answer them itself. What makes this safe: a new grant
// checks the old lease and installs the new holder under one leaseMu (Acquire), and a drop
// checks and marks the table under one (DropTable), so a renewal either comes first (then
// the lease is live and the grant or drop is refused) or sees the new holder, or the drop,
// and is refused.

// Acquire grants owner the write ownership of table. With epoch 0 it asks for a new grant: it
// succeeds when the table is free, held by owner already, or held by another owner whose lease
// has expired, and it bumps the epoch. With a nonzero epoch it renews that grant (RenewGrant).
func (e *Engine) Acquire(tableID uint32, owner, epoch uint64) (base.Grant, error) {
	return e.AcquireFrom(tableID, owner, epoch, 0)
}

// AcquireFrom is Acquire for a request of connection conn (nonzero: a storage node's
// session), which must still hold owner's identity (HoldsIdent), checked together with
// reading the incarnation the grant makes the table's holder (holderReads): else
// ErrIdentityLost, nothing granted. Any goroutine but an event loop.
func (e *Engine) AcquireFrom(tableID uint32, owner, epoch, conn uint64) (base.Grant, error) {
	if owner == 0 || owner == MoveWriter {
		return base.Grant{}, fmt.Errorf("%w: owner id %d (0 and 2^64-1 are reserved)", ErrMalformed, owner)
	}
	if epoch != 0 {
		return e.RenewGrantFrom(tableID, owner, epoch, conn)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.usable(); err != nil {
		return base.Grant{}, err
	}
	if err := e.checkLeader(); err != nil {
		return base.Grant{}, err
	}
	t, err := e.table(tableID)
	if err != nil {
		return base.Grant{}, err
	}
	if t.cluster.IsCluster() {
		return base.Grant{}, clusterLocalGrantError(t)
	}
	if t.holder != owner && e.tableLocked(t.id) {
		// A new owner would cache rows that a pending decision may still change (txn.go).
		return base.Grant{}, fmt.Errorf("%w: table %q has rows of a transaction in doubt: granted once it is resolved", ErrTxnLocked, t.name)
	}
	// The old lease's check and the new holder under one leaseMu: a renewal by the old holder
	// (which takes no mu) either came first, and then its lease is live, or sees the new
	// holder and is fenced. If the grant cannot be logged the old holder is put back.
	inc, err := e.identIncFrom(owner, conn)
	if err != nil {
		return base.Grant{}, err
	}
	e.leaseMu.Lock()
	now := e.opts.Now()
	if e.liveHolder(t, owner) {
		left, atOpen := t.leaseUntil.Sub(now), t.leaseAtOpen
		e.leaseMu.Unlock()
		if atOpen {
			return base.Grant{}, fmt.Errorf("%w: table %q is held by another owner for up to another %v: "+
				"its lease restarted when this storage node opened and its holder has not renewed it since; "+
				"a transaction node restarted with the holder's owner id (Options.OwnerID) takes it back at once",
				ErrTableOwned, t.name, left)
		}
		return base.Grant{}, fmt.Errorf("%w: table %q is held by another owner for up to another %v",
			ErrTableOwned, t.name, left)
	}
	if e.opts.Proposer != nil {
		e.leaseMu.Unlock()
		return e.acquireProposed(t, owner, inc)
	}
	oldHolder, oldEpoch, oldLease, oldInc := t.holder, t.epoch, t.leaseUntil, t.holderInc
	e.applyGrantOwnerLocked(t, owner, t.epoch+1)
	t.holderInc = inc
	t.leaseUntil, t.leaseAtOpen = now.Add(e.opts.LeaseDuration), false
	e.leaseMu.Unlock()
	e.scratch = appendGrantOwnerRecord(e.scratch[:0], t.id, owner, t.epoch)
	ch := make(chan error, 1)
	if _, err := e.appendRecord(kindGrantOwner, e.scratch, true, func(_ uint64, err error) { ch <- err }); err != nil {
		e.leaseMu.Lock()
		t.holder, t.epoch, t.leaseUntil, t.holderInc = oldHolder, oldEpoch, oldLease, oldInc
		e.leaseMu.Unlock()
		return base.Grant{}, err
	}
	g := e.grant(t, owner)
	e.mu.Unlock()
	err = <-ch
	e.mu.Lock()
	if err != nil {
		return base.Grant{}, err
	}
	return g, nil
}

// clusterLocalGrantError is the refusal of a local-counter grant or renewal of cluster table t.
func clusterLocalGrantError(t *table) error {
	return fmt.Errorf("%w: table %q is cluster-managed: its grants come from etcd (register one with the etcd-grant flag)", ErrGrantKind, t.name)
}

func (e *Engine) grant(t *table, owner uint64) base.Grant {
	g := base.Grant{Table: t.id, Owner: owner, Epoch: t.epoch, Lease: e.opts.LeaseDuration}
	if o := e.owners[owner]; o != nil {
		g.LastSeq = o.lastSeq
	}
	return g
}

// RenewGrant renews owner's grant of epoch on table: its lease runs a LeaseDuration from now.
// It fails with ErrFenced when the table has been granted since (or the owner released its
// identity: ReleaseOwner), ErrTableNotFound when it is gone or being dropped, ErrClosed
// after Close, and with the engine's failure after a fail-stop. It takes no mu, only identMu
// and leaseMu for a few loads and stores, so a checkpoint or commits holding mu never delay
// it: a storage node's event loop answers it itself. Any goroutine. The grant's LastSeq is
// the owner's last applied seq, as a new grant's (leaseSeqs).
func (e *Engine) RenewGrant(tableID uint32, owner, epoch uint64) (base.Grant, error) {
	return e.RenewGrantFrom(tableID, owner, epoch, 0)
}

// RenewGrantFrom is RenewGrant for a request of connection conn (nonzero: a storage node's
// session), which must still hold owner's identity (HoldsIdent), checked under the same lock
// as the renewal: else ErrIdentityLost. The renewal makes the identity's incarnation the one
// that reads t as its holder (holderReads); checked apart, a claim of another incarnation in
// between would have been given that. Any goroutine, an event loop included.
func (e *Engine) RenewGrantFrom(tableID uint32, owner, epoch, conn uint64) (base.Grant, error) {
	if owner == 0 || epoch == 0 {
		return base.Grant{}, fmt.Errorf("%w: renewal of owner %d epoch %d", ErrMalformed, owner, epoch)
	}
	if e.shut.Load() {
		return base.Grant{}, ErrClosed
	}
	if err := e.failure(); err != nil {
		return base.Grant{}, err
	}
	if p := e.opts.Proposer; p != nil {
		// A replica renews only while it leads: a follower's answer could be stale (the
		// table granted since, at the leader). Under the lease itself: stage R4.
		if _, ok := p.Lease(); !ok {
			return base.Grant{}, ErrNotLeader
		}
	}
	e.identMu.Lock()
	defer e.identMu.Unlock()
	var inc Incarnation // the renewer's: it knows the grant (holderReads)
	if id := e.idents[owner]; conn != 0 && !id.holds(conn) {
		return base.Grant{}, fmt.Errorf("%w: owner %d, connection %d (replaced or released)", ErrIdentityLost, owner, conn)
	}
	if id := e.idents[owner]; id != nil {
		if id.released {
			return base.Grant{}, fmt.Errorf("%w: owner %d released its tables", ErrFenced, owner)
		}
		inc = id.inc
	}
	e.leaseMu.Lock()
	defer e.leaseMu.Unlock()
	t, ok := e.tables[tableID]
	if !ok || t.dropping {
		return base.Grant{}, fmt.Errorf("%w: id %d", ErrTableNotFound, tableID)
	}
	if t.cluster.IsCluster() {
		return base.Grant{}, clusterLocalGrantError(t)
	}
	if t.holder != owner || t.epoch != epoch {
		return base.Grant{}, fmt.Errorf("%w: table %q: the grant of epoch %d is no longer current", ErrFenced, t.name, epoch)
	}
	t.leaseUntil, t.leaseAtOpen = e.opts.Now().Add(e.opts.LeaseDuration), false
	t.holderInc = inc
	return base.Grant{Table: t.id, Owner: owner, Epoch: epoch, Lease: e.opts.LeaseDuration, LastSeq: e.leaseSeqs[owner]}, nil
}

// setLease sets t's lease to end at until. Caller holds mu (a holder's commit or id grant
// renews it).
func (e *Engine) setLease(t *table, until time.Time) {
	e.leaseMu.Lock()
	t.leaseUntil, t.leaseAtOpen = until, false
	e.leaseMu.Unlock()
}

// Release ends owner's lease on table at once, so another owner may be granted it without
// waiting. The epoch stays: the released owner is fenced as soon as someone else is granted.
func (e *Engine) Release(tableID uint32, owner, epoch uint64) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	t, err := e.table(tableID)
	if err != nil {
		return err
	}
	if t.holder == owner && t.epoch == epoch {
		e.setLease(t, e.opts.Now())
	}
	return nil
}

// Renew extends the leases of every table owner holds, and its identity's: any traffic from
// the owner counts. Like RenewGrant it takes no mu: any goroutine, an event loop included.
func (e *Engine) Renew(owner uint64) {
	if e.shut.Load() {
		return // closed: it renews nothing (ErrClosed for every call)
	}
	e.identMu.Lock()
	defer e.identMu.Unlock()
	now := e.opts.Now()
	id := e.idents[owner]
	if id != nil {
		id.lastSeen = now
	}
	if id != nil && id.released {
		return // a late request of a node that released its tables does not take them back
	}
	e.leaseMu.Lock()
	defer e.leaseMu.Unlock()
	until := e.opts.Now().Add(e.opts.LeaseDuration)
	for _, t := range e.tables {
		if t.holder == owner {
			t.leaseUntil, t.leaseAtOpen = until, false
		}
	}
}

// checkFence reports whether owner may write t with epoch. Caller holds mu.
func (e *Engine) checkFence(t *table, owner, epoch uint64) error {
	if t.holder != owner || t.epoch != epoch {
		// Never name the holder or its epoch: the caller may be another owner.
		return fmt.Errorf("%w: table %q: epoch %d is not this owner's current grant", ErrFenced, t.name, epoch)
	}
	return nil
}

// AllocIDs grants owner pages whole pages of new row ids of table (64 ids a page) and returns
// the first id and the count. The grant is logged and synced before it returns, in every sync
// mode, so no id is ever handed out twice; ids are never reused. For a cluster-managed table
// the ids are its partition's, one run within one stripe: the count may be less than asked
// (whole pages still).
func (e *Engine) AllocIDs(tableID uint32, owner, epoch uint64, pages int) (first, count uint64, err error) {
	if pages <= 0 || pages > idPagesPerGrantMax {
		return 0, 0, fmt.Errorf("%w: id grant of %d pages", ErrMalformed, pages)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.usable(); err != nil {
		return 0, 0, err
	}
	if err := e.checkLeader(); err != nil {
		return 0, 0, err
	}
	t, err := e.table(tableID)
	if err != nil {
		return 0, 0, err
	}
	if err := e.checkFence(t, owner, epoch); err != nil {
		return 0, 0, err
	}
	if err := e.moveRefuses(t); err != nil {
		return 0, 0, err
	}
	if e.opts.Proposer != nil {
		return e.allocIDsProposed(t, pages)
	}
	count = uint64(pages) * 64
	first = t.nextID
	if t.cluster.IsCluster() {
		// Ids of the partition's stripes only, one run within a stripe (cluster.go).
		if first, count, err = t.clusterAllocIDs(pages); err != nil {
			return 0, 0, err
		}
	} else if hi, carry := bits.Add64(first, count, 0); carry != 0 || hi > MaxRowID {
		return 0, 0, fmt.Errorf("%w: table %q has no ids left (row ids stop below %d)", ErrMalformed, t.name, uint64(MaxRowID))
	}
	// Advance before waiting, so a concurrent grant takes the next range; if the record then
	// fails, those ids are skipped, never handed out twice.
	e.applyGrantIDs(t, first+count) // first is at or above t.nextID
	e.setLease(t, e.opts.Now().Add(e.opts.LeaseDuration))
	e.scratch = appendGrantIDsRecord(e.scratch[:0], t.id, first+count)
	if err := e.appendAndWait(kindGrantIDs, e.scratch); err != nil {
		return 0, 0, err
	}
	return first, count, nil
}
