package storenode

import (
	"fmt"
	"time"
)

// hasIdent reports whether owner has a live identity (a connection, or silence shorter than a
// lease). Caller holds mu.
func (e *Engine) hasIdent(owner uint64, now time.Time) bool {
	e.identMu.Lock()
	defer e.identMu.Unlock()
	id := e.idents[owner]
	return id != nil && (id.conn != 0 || !id.released && now.Sub(id.lastSeen) < e.opts.LeaseDuration)
}

// Owner identity. An owner id belongs to one live incarnation at a time: a transaction node
// picks a random 128-bit incarnation at Open and sends it in every Hello. The storage node's
// handshake claims the owner id for the connection (Connect):
//
//   - no identity known (first contact since this engine opened): the claim succeeds;
//   - the same incarnation: the claim succeeds at once and the holder's old connection, if
//     any, is closed (a reconnect, even before the server noticed the old connection close);
//   - another incarnation: the claim succeeds only if the holder released the owner id
//     (ReleaseOwner: the Release request of Close) or has been silent for a lease (no
//     traffic, no connection, measured on the engine's clock); otherwise ErrOwnerInUse.
//
// A dropped connection does not release the owner id: the process may be alive and may still
// serve reads for the rest of its lease, so another incarnation waits for a lease of silence.
// Identities live in memory only: after a storage node restart the first incarnation to
// connect claims the id (the other is then refused; fences keep its old batches out).
// The map holds an entry per owner with a connection or one silent for less than a lease
// (claims prune the rest), so it is bounded by the connections of the last lease.

// Incarnation is a transaction node's random 128-bit instance id, chosen at Open.
type Incarnation [16]byte

// ownerIdent is the live identity of an owner id. Guarded by Engine.identMu, which is taken
// alone or inside mu (never the other way round) and held only for map updates, so the
// handshake may claim an identity on a connection's event loop.
type ownerIdent struct {
	inc  Incarnation
	conn uint64 // the connection holding it; 0 when none
	// closed is the connection that held it when it closed (Disconnect), while conn is 0:
	// its requests queued before the close still act (holds), no other connection's.
	closed   uint64
	evict    func() // closes conn
	lastSeen time.Time
	released bool
}

// Connect claims owner for connection conn (a token unique per connection, nonzero) of
// incarnation inc; evict closes the connection if a later claim replaces it (it is called
// without the engine's lock, on the claiming goroutine). It fails with ErrOwnerInUse while
// another incarnation holds the owner id. The error does not name the holder.
func (e *Engine) Connect(owner uint64, inc Incarnation, conn uint64, evict func()) error {
	if owner == 0 || owner == MoveWriter || conn == 0 {
		return fmt.Errorf("%w: owner id %d (0 and 2^64-1 are reserved) or connection 0", ErrMalformed, owner)
	}
	e.identMu.Lock()
	now := e.opts.Now()
	lease := e.opts.LeaseDuration
	id := e.idents[owner]
	var old func()
	switch {
	case id == nil:
	case id.inc == inc, id.released, now.Sub(id.lastSeen) >= lease:
		if id.conn != conn {
			old = id.evict
		}
	default:
		wait := lease - now.Sub(id.lastSeen)
		e.identMu.Unlock()
		return fmt.Errorf("%w: another incarnation of this owner id is live; retry once it closes or after %v of silence",
			ErrOwnerInUse, wait.Round(time.Millisecond))
	}
	e.idents[owner] = &ownerIdent{inc: inc, conn: conn, evict: evict, lastSeen: now}
	e.pruneIdents(now)
	e.identMu.Unlock()
	if old != nil {
		old()
	}
	return nil
}

// HoldsIdent reports whether connection conn still holds owner's identity: false once a
// later claim replaced it (its connection is being closed, asynchronously), once the id was
// released, or once a claim pruned its entry (closed, and silent for a lease). A lease of
// silence alone does not end it: it lets another incarnation claim the id, and only that claim
// does (epochs fence the lapsed holder's writes meanwhile, as always). A connection that
// merely closed still holds it (its requests queued before the close still act, as its owner
// may resend them anyway): nobody else has claimed the id. A connection replaced earlier does
// not get it back when the later one closes (TestReplacedConnectionStaysReplacedAfterNextCloses).
// The server checks it before a replaced connection's last requests could act
// as the owner. Any goroutine; it takes identMu only.
func (e *Engine) HoldsIdent(owner uint64, conn uint64) bool {
	e.identMu.Lock()
	defer e.identMu.Unlock()
	return e.idents[owner].holds(conn)
}

// holds reports whether connection conn holds the identity id (nil: none): it is id's
// connection, or the one that held it when it closed (its queued requests still act; a
// connection replaced earlier does not get it back when the later one closes). Caller holds
// identMu.
func (id *ownerIdent) holds(conn uint64) bool {
	return id != nil && !id.released && (id.conn == conn || id.conn == 0 && id.closed == conn)
}

// pruneIdents drops identities without a connection that have been silent for a lease (a
// claim would succeed anyway). Caller holds identMu.
func (e *Engine) pruneIdents(now time.Time) {
	if len(e.idents) < 64 {
		return
	}
	for owner, id := range e.idents {
		if id.conn == 0 && (id.released || now.Sub(id.lastSeen) >= e.opts.LeaseDuration) {
			delete(e.idents, owner)
		}
	}
}

// Disconnect ends conn's claim of owner (the connection closed). The owner id stays with its
// incarnation until a lease of silence passes, unless it was released.
func (e *Engine) Disconnect(owner uint64, conn uint64) {
	e.identMu.Lock()
	defer e.identMu.Unlock()
	if id := e.idents[owner]; id != nil && id.conn == conn {
		id.conn, id.evict, id.closed = 0, nil, conn
		id.lastSeen = e.opts.Now()
	}
}

// ReleaseOwner ends, at once, every lease owner holds and its identity, so that another owner
// may acquire its tables and another incarnation may take its id without waiting. Only the
// identity's own connection (conn) may release it; a conn that no longer holds the id (it was
// replaced) releases nothing. Epochs stay: the released owner is fenced as soon as another is
// granted. A transaction node calls it (the Release request) from Close, after its last batch
// is durable.
func (e *Engine) ReleaseOwner(owner uint64, conn uint64) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.usable(); err != nil {
		return err
	}
	e.identMu.Lock()
	defer e.identMu.Unlock()
	id := e.idents[owner]
	if id == nil || id.conn != conn {
		return fmt.Errorf("%w (replaced or released)", ErrIdentityLost)
	}
	e.releaseTables(owner)
	id.released = true
	return nil
}

// ReleaseTables ends, at once, every lease owner holds (the embedded engine's Close path,
// which has no connection). Caller must be the owner.
func (e *Engine) ReleaseTables(owner uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.releaseTables(owner)
}

func (e *Engine) releaseTables(owner uint64) {
	e.leaseMu.Lock()
	defer e.leaseMu.Unlock()
	now := e.opts.Now()
	for _, t := range e.tables {
		if t.holder == owner && t.leaseUntil.After(now) {
			t.leaseUntil = now
		}
	}
}

// identInc reports the incarnation that holds owner's id now: the zero Incarnation when no
// connection has claimed it since this engine opened (an embedded engine, whose caller is the
// only writer); ok is false once the id was released. Any goroutine; it takes identMu, so a
// caller holding leaseMu must not call it.
func (e *Engine) identInc(owner uint64) (inc Incarnation, ok bool) {
	e.identMu.Lock()
	defer e.identMu.Unlock()
	id := e.idents[owner]
	if id == nil {
		return Incarnation{}, true
	}
	return id.inc, !id.released
}

// identIncFrom is identInc for a request of connection conn (nonzero: a storage node's
// session) about to make the incarnation a table's holder incarnation (a grant or a
// renewal): it fails with ErrIdentityLost unless conn still holds owner's id (HoldsIdent).
// The check and the read are one, under identMu: checked apart (the session's checkHolder,
// then the grant), another incarnation's claim in between would have its incarnation
// installed for this connection's request, and it would read rows not durable yet that it
// did not write. conn 0 (an embedded engine's call) is identInc. Caller must not hold leaseMu.
func (e *Engine) identIncFrom(owner, conn uint64) (Incarnation, error) {
	if conn == 0 {
		inc, _ := e.identInc(owner)
		return inc, nil
	}
	e.identMu.Lock()
	defer e.identMu.Unlock()
	id := e.idents[owner]
	if !id.holds(conn) {
		return Incarnation{}, fmt.Errorf("%w: owner %d, connection %d (replaced or released)", ErrIdentityLost, owner, conn)
	}
	return id.inc, nil
}

// holderReads reports whether reader reads t as its holder, so is served rows not durable
// yet (its own writes): reader is t's holder (an owner id) and the incarnation holding that
// id now is the one that was granted (or last renewed) t. A restarted transaction node that
// reuses its owner id, or a replaced connection's late reads, share the owner id but not the
// incarnation: they are readers like any other until granted the table again, and see only
// durable rows. Caller holds mu (holder); it takes identMu, then leaseMu.
func (e *Engine) holderReads(t *table, reader uint64) bool {
	if !t.heldBy(reader) {
		return false
	}
	inc, ok := e.identInc(reader)
	if !ok {
		return false
	}
	e.leaseMu.Lock()
	defer e.leaseMu.Unlock()
	return t.holderInc == inc
}

// liveHolder reports whether t has a holder other than owner whose lease is live. Caller
// holds leaseMu.
func (e *Engine) liveHolder(t *table, owner uint64) bool {
	return t.holder != 0 && t.holder != owner && e.opts.Now().Before(t.leaseUntil)
}
