package txnode

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/weftdb/weft/txnode/store"
)

// Leases: each owned table's lease is renewed (a cluster table's etcd grant registered again)
// every quarter lease, each on a goroutine of its own; serving says whether the node may still
// serve a table, and a refusal (a fence, a table gone) is latched.

// leaseUsable is how long after a grant request this node trusts its lease: a margin below
// the lease for clock drift and delays, so it stops serving before the storage node could
// grant the table to someone else.
func leaseUsable(lease time.Duration) time.Duration { return lease * 3 / 4 }

// renewLeases keeps every owned table's lease alive (remote stores only) and re-registers
// each cluster-managed table's etcd grant with its store (renewGrant): every quarter lease
// (grantRecheckInterval for an embedded store, whose grants never expire) it starts a
// renewal of each table that has none running, each on a goroutine of its own, so a slow
// renewal delays no other table's.
func (db *DB) renewLeases() {
	defer db.bg.Done()
	period := db.info.Lease / 4
	if period <= 0 {
		period = grantRecheckInterval
	}
	tickC := db.opts.renewTick
	if tickC == nil {
		tick := time.NewTicker(period)
		defer tick.Stop()
		tickC = tick.C
	}
	ctx, cancel := context.WithCancel(context.Background()) // ends the renewals running at Close
	defer cancel()
	for {
		select {
		case <-db.stop:
			return
		case <-tickC:
		case <-db.renewNow:
		}
		db.mu.Lock()
		ts := make([]*tableState, 0, len(db.byID))
		local := 0
		for _, t := range db.byID {
			if t.grantCheck == nil {
				local++
			}
			if t.grantCheck != nil || db.info.Lease > 0 {
				ts = append(ts, t)
			}
		}
		db.mu.Unlock()
		if local == 0 && db.info.Lease > 0 {
			// No lease to renew: traffic all the same, or the storage node would let another
			// incarnation take this node's owner id after a lease of silence (as before
			// cluster tables were re-registered here: a keepalive that does not wait for etcd
			// or an fsync).
			ctx, cancel := context.WithTimeout(context.Background(), period)
			if err := db.store.Ping(ctx); err != nil && !db.outageErr(err) {
				db.opts.Logger.Warn("txnode: keepalive failed", "err", err)
			}
			cancel()
		}
		for _, t := range ts {
			if !t.renewing.CompareAndSwap(false, true) {
				continue // the last renewal is still waiting for its reply: it may succeed yet
			}
			db.bg.Add(1)
			if t.grantCheck != nil {
				go db.renewGrant(ctx, t, period)
			} else {
				go db.renewLease(ctx, t, period)
			}
		}
	}
}

// renewSoon makes renewLeases start a round now (the storage node is back). It does not block.
func (db *DB) renewSoon() {
	select {
	case db.renewNow <- struct{}{}:
	default:
	}
}

// outageErr reports whether err, a renewal's or keepalive's, is the remote store's outage,
// which the store logs itself, once when it loses the storage node and once when it is back:
// not logged again per table and tick.
func (db *DB) outageErr(err error) bool {
	return db.remote != nil && (errors.Is(err, ErrUnavailable) || db.remote.disconnected())
}

// grantRecheckInterval is how often a transaction node over an embedded store re-registers
// the etcd grant of each cluster-managed table it serves (over a storage node: every quarter
// of the storage node's lease, with the lease renewals).
const grantRecheckInterval = time.Second

// renewGrant re-registers t's etcd grant (cluster-managed t) with the store once, on its own
// goroutine (renewLeases), so a node that only reads the table hears of a store-side fence
// within a renewal period, not only at its next write: the store answers a registration of
// its current grant without asking etcd, once the grant's record is durable; ErrFenced (a
// newer grant is registered there, or the store is a restored copy whose floor is above it)
// latches storeFenced, ErrTableNotFound (dropped at the store) latches storeGone, and the
// table stops serving. A grant already lost, fenced or dropped is not re-registered. ctx
// ends at Close.
func (db *DB) renewGrant(ctx context.Context, t *tableState, period time.Duration) {
	defer db.bg.Done()
	var err error
	defer func() {
		// The next tick may start a renewal once renewing is clear: cleared before the
		// test hook hears this one ended, or a tick right after it finds this one running.
		t.renewing.Store(false)
		if db.opts.renewed != nil {
			db.opts.renewed(t.name, err)
		}
	}()
	if t.dropped.Load() || t.storeFenced.Load() || t.grantCheck() != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, period)
	_, err = db.store.Acquire(ctx, t.id, db.owner, t.epoch.Load(), store.AcquireEtcdGrant)
	cancel()
	if err != nil {
		switch {
		case errors.Is(err, ErrTableNotFound):
			t.storeGone.Store(true)
			t.storeFenced.Store(true)
		case errors.Is(err, ErrFenced):
			t.storeFenced.Store(true)
		}
		db.renewFailed(t, err, "txnode: re-registration of an etcd grant failed")
		return
	}
	db.stats.renewals.Add(1)
}

// renewFailed counts a failed renewal or re-registration of t (err) and logs it as msg
// unless err is an outage's; nothing failed when Close ended it or this node's DropTable
// raced it (droppedHere).
func (db *DB) renewFailed(t *tableState, err error, msg string) {
	select {
	case <-db.stop: // Close ended it: nothing failed
	default:
		if droppedHere(t, err) {
			return
		}
		db.stats.renewFails.Add(1)
		if !db.outageErr(err) {
			db.opts.Logger.Warn(msg, "table", t.name, "err", err)
		}
	}
}

// droppedHere reports whether err, a renewal's or re-registration's, says the store has no
// such table because this node's DropTable is dropping it (or dropped it) meanwhile: the
// renewal raced the drop, nothing failed.
func droppedHere(t *tableState, err error) bool {
	return errors.Is(err, ErrTableNotFound) && (t.dropping.Load() || t.dropped.Load())
}

// renewLease renews t's lease once, on its own goroutine (renewLeases). The renewal is given
// as long as it can still do good: until the lease it extends stops being usable (at least
// period, at most a lease), not a fixed slice of it, so a renewal slowed by a busy node
// (its reply waits for the CPU behind runnable goroutines) is not abandoned while its reply
// could still keep the table served. ctx ends at Close.
func (db *DB) renewLease(ctx context.Context, t *tableState, period time.Duration) {
	defer db.bg.Done()
	defer t.renewing.Store(false)
	start := db.opts.clock.nanos()
	wait := period
	if lu := t.leaseUntil.Load(); lu != leaseLapsed && lu-start > int64(wait) {
		wait = min(time.Duration(lu-start), db.info.Lease)
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	g, err := db.store.Acquire(ctx, t.id, db.owner, t.epoch.Load(), 0)
	cancel()
	if err != nil {
		if errors.Is(err, ErrFenced) || errors.Is(err, ErrTableNotFound) {
			// The store granted the table since (another owner, or a restored
			// backup's epoch bump), or has no such table (dropped by another
			// node, or a restored backup older than the table): this node's
			// cache may hold rows the store does not, so it stops serving the
			// table at once, not at lease end.
			t.leaseUntil.Store(leaseLapsed)
		}
		db.renewFailed(t, err, "txnode: lease renewal failed")
		return
	}
	t.leaseUntil.Store(start + int64(leaseUsable(g.Lease)))
	db.stats.renewals.Add(1)
}

// serving reports whether this node may serve t: not dropped, lease live.
func (t *tableState) serving() error {
	if t.dropped.Load() {
		if t.forgotten.Load() {
			return t.forgottenErr()
		}
		return fmt.Errorf("%w: %q was dropped", ErrTableNotFound, t.name)
	}
	if t.grantCheck != nil {
		if t.storeFenced.Load() {
			if t.storeGone.Load() {
				return fmt.Errorf("%w: %q was dropped at the store", ErrTableNotFound, t.name)
			}
			return fmt.Errorf("%w: %q: the store fenced this node's etcd grant (%w: a newer one is registered, or the store was restored): reopen the table under a new grant",
				ErrLeaseExpired, t.name, ErrFenced)
		}
		if err := t.grantCheck(); err != nil {
			return fmt.Errorf("%w: %q: %w", ErrLeaseExpired, t.name, err)
		}
		return nil
	}
	lu := t.leaseUntil.Load()
	if lu == 0 {
		return nil
	}
	if lu != leaseLapsed {
		now := t.clock.nanos()
		if now <= lu {
			return nil
		}
		// Load it again: a renewal stored while this goroutine waited for the CPU between
		// the first load and the clock read (a second or more on a node whose goroutines
		// keep the cores busy) is what the time read must be compared with.
		if lu = t.leaseUntil.Load(); lu != leaseLapsed && now <= lu {
			return nil
		}
	}
	if lu != leaseLapsed {
		// Latch it: a clock that went back (only an injected one can) does not revive it.
		t.leaseUntil.CompareAndSwap(lu, leaseLapsed)
	}
	return fmt.Errorf("%w: %q", ErrLeaseExpired, t.name)
}

// noteFenced latches a cluster-managed table's grant as fenced by the store when err says so
// (storeFenced). Any goroutine.
func (t *tableState) noteFenced(err error) {
	if t.grantCheck != nil && errors.Is(err, ErrFenced) {
		t.storeFenced.Store(true)
	}
}

// leaseLapsed marks a lease that serving saw run out; only a renewal replaces it.
const leaseLapsed = math.MinInt64

// leaseClock is the clock of ownership leases: nanoseconds on a monotonic clock, from an
// arbitrary origin. Any goroutine may call it.
type leaseClock interface{ nanos() int64 }

// monoClock is the default leaseClock: Go's monotonic clock (time.Since of a reading that
// carries one), which a change of the wall clock does not move.
type monoClock struct{ origin time.Time }

func (c monoClock) nanos() int64 { return int64(time.Since(c.origin)) }

// latchRefused asks the store again for t's grant (a cluster-managed table's registration, or
// a local table's renewal), after a commit batch holding t was refused: a fence
// (ErrFenced, ErrMoved) or a table gone at the store (ErrTableNotFound) latches t as not
// served, as the renewals do. It reports whether t is latched now; err is the store's error
// when it neither granted nor refused.
func (db *DB) latchRefused(ctx context.Context, t *tableState) (latched bool, err error) {
	if t.dropped.Load() {
		return true, nil
	}
	if t.grantCheck != nil {
		if t.storeFenced.Load() {
			return true, nil
		}
		_, err = db.store.Acquire(ctx, t.id, db.owner, t.epoch.Load(), store.AcquireEtcdGrant)
		switch {
		case err == nil:
			return false, nil
		case errors.Is(err, ErrTableNotFound):
			t.storeGone.Store(true)
			t.storeFenced.Store(true)
			return true, nil
		case errors.Is(err, ErrFenced):
			t.storeFenced.Store(true)
			return true, nil
		}
		return false, err
	}
	if t.leaseUntil.Load() == leaseLapsed {
		return true, nil
	}
	_, err = db.store.Acquire(ctx, t.id, db.owner, t.epoch.Load(), 0)
	switch {
	case err == nil:
		return false, nil
	case errors.Is(err, ErrFenced) || errors.Is(err, ErrTableNotFound) || errors.Is(err, ErrTableOwned):
		t.leaseUntil.Store(leaseLapsed)
		return true, nil
	}
	return false, err
}
