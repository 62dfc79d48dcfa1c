package storenode

import (
	"fmt"
	"math/bits"
)

// Ownership and id grants. One owner (a transaction node) writes a table at a time. A grant is
// (owner, epoch): the epoch is bumped and logged, synced, on every grant, and every commit
// batch presents the epoch of each table it writes, so a cut-off old owner is fenced. Leases
// live in memory only: after a restart every holder's lease starts afresh, so a new owner can
// never be granted a table before an old owner's lease could have run out.

// Acquire grants owner the write ownership of table. With epoch 0 it asks for a new grant: it
// succeeds when the table is free, held by owner already, or held by another owner whose lease
// has expired, and it bumps the epoch. With a nonzero epoch it renews that grant, keeping the
// epoch, and fails with ErrFenced when the table has been granted since.
func (e *Engine) Acquire(tableID uint32, owner, epoch uint64) (Grant, error) {
	if owner == 0 {
		return Grant{}, fmt.Errorf("%w: owner id 0", ErrMalformed)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.usable(); err != nil {
		return Grant{}, err
	}
	t, err := e.table(tableID)
	if err != nil {
		return Grant{}, err
	}
	now := e.opts.Now()
	if epoch != 0 {
		if t.holder != owner || t.epoch != epoch {
			return Grant{}, fmt.Errorf("%w: table %q: the grant of epoch %d is no longer current", ErrFenced, t.name, epoch)
		}
		t.leaseUntil = now.Add(e.opts.LeaseDuration)
		return e.grant(t, owner), nil
	}
	if e.liveHolder(t, owner) {
		return Grant{}, fmt.Errorf("%w: table %q is held by another owner for up to another %v",
			ErrTableOwned, t.name, t.leaseUntil.Sub(now))
	}
	e.scratch = appendGrantOwnerRecord(e.scratch[:0], t.id, owner, t.epoch+1)
	ch := make(chan error, 1)
	if _, err := e.appendRecord(kindGrantOwner, e.scratch, true, func(_ uint64, err error) { ch <- err }); err != nil {
		return Grant{}, err
	}
	t.holder, t.epoch = owner, t.epoch+1
	t.leaseUntil = now.Add(e.opts.LeaseDuration)
	g := e.grant(t, owner)
	e.mu.Unlock()
	err = <-ch
	e.mu.Lock()
	if err != nil {
		return Grant{}, err
	}
	return g, nil
}

func (e *Engine) grant(t *table, owner uint64) Grant {
	g := Grant{Table: t.id, Owner: owner, Epoch: t.epoch, Lease: e.opts.LeaseDuration}
	if o := e.owners[owner]; o != nil {
		g.LastSeq = o.lastSeq
	}
	return g
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
		t.leaseUntil = e.opts.Now()
	}
	return nil
}

// Renew extends the leases of every table owner holds, and its identity's: any traffic from
// the owner counts.
func (e *Engine) Renew(owner uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.opts.Now()
	e.identMu.Lock()
	id := e.idents[owner]
	released := id != nil && id.released
	if id != nil {
		id.lastSeen = now
	}
	e.identMu.Unlock()
	if released {
		return // a late request of a node that released its tables does not take them back
	}
	until := now.Add(e.opts.LeaseDuration)
	for _, t := range e.tables {
		if t.holder == owner {
			t.leaseUntil = until
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
// mode, so no id is ever handed out twice; ids are never reused.
func (e *Engine) AllocIDs(tableID uint32, owner, epoch uint64, pages int) (first, count uint64, err error) {
	if pages <= 0 || pages > idPagesPerGrantMax {
		return 0, 0, fmt.Errorf("%w: id grant of %d pages", ErrMalformed, pages)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.usable(); err != nil {
		return 0, 0, err
	}
	t, err := e.table(tableID)
	if err != nil {
		return 0, 0, err
	}
	if err := e.checkFence(t, owner, epoch); err != nil {
		return 0, 0, err
	}
	count = uint64(pages) * 64
	first = t.nextID
	if hi, carry := bits.Add64(first, count, 0); carry != 0 || hi > MaxRowID {
		return 0, 0, fmt.Errorf("%w: table %q has no ids left (row ids stop below %d)", ErrMalformed, t.name, uint64(MaxRowID))
	}
	// Advance before waiting, so a concurrent grant takes the next range; if the record then
	// fails, those ids are skipped, never handed out twice.
	t.nextID = first + count
	t.leaseUntil = e.opts.Now().Add(e.opts.LeaseDuration)
	e.scratch = appendGrantIDsRecord(e.scratch[:0], t.id, first+count)
	if err := e.appendAndWait(kindGrantIDs, e.scratch); err != nil {
		return 0, 0, err
	}
	return first, count, nil
}
