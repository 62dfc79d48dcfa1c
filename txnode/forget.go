package txnode

import (
	"context"
	"errors"
	"fmt"
)

// Forgetting a table: the node gives up everything it knows of one table (its state, its
// cached frames, its pin, its grant) and keeps nothing at the store changed, so that the
// next open of the table in this DB acquires it afresh, as a DB that never had it would.
// A game server's cluster node forgets a partition's table when it releases the partition
// or loses its grant, so that it can own the partition again later (cluster/node).
//
// Invariants:
//   - nothing acknowledged is lost: the table is closed to commits first (forgotten, with
//     closeTable's barrier, as DropTable closes it), then every commit admitted before is made durable (pipeline.flush:
//     WriteBack flushes an epoch), and only then is the state forgotten; a flush that fails,
//     or a ctx that ends before the state is forgotten, reopens the table as it was;
//   - a forgotten state never serves again: forgotten is set before the table is closed to
//     commits (their admission, droppingErr, fails with ErrForgotten from then on) and
//     dropped after the flush, before its frames are dropped, so every check of a dropped
//     table applies (serving, pins and Unpin, renewals, latches, transactions): old handles
//     and transactions fail with ErrForgotten, wrapped;
//   - no frame of a forgotten state is served by the table's next state: the frames are
//     dropped at the forget (cache.dropTable) and again when the table is acquired anew
//     (forgottenFrames, in adopt), after its new grant is registered with the store and
//     before the new state is shared, so a frame a reader of the old state created
//     between the two (it checked serving before the forget) is dropped too, and one it
//     creates later holds the store's rows read under the new grant;
//   - the grant is released after the flush (a late write of this node's never reaches the
//     store under it: the table takes no more commits), so another node's grant, taken
//     once it is released, is never fenced by one of this node's batches. A caller that
//     releases the grant itself (or must keep it) says so through its grants'
//     release function, which forget calls with its ctx.
//
// The failed ranges (failRanges) and held batches are versions, not tables: a forgotten
// table's rows in them are dropped with its frames, and the next state's are fetched again
// (fill stamps fresh versions once a batch failed), so nothing there changes.

// ErrForgotten is wrapped by the errors of a handle or transaction of a table this node
// forgot since it was opened (txncoord.Forget: a cluster node released the partition or
// lost its grant): open the table again (DB.Table) to acquire it afresh. It also wraps
// ErrLeaseExpired: the node stopped trusting its ownership through that handle.
var ErrForgotten = errors.New("txnode: table forgotten by this node")

// forgetTable forgets the table name (forget on its current state): a no-op for a table
// this node has not opened (or forgot already).
func (db *DB) forgetTable(ctx context.Context, name string) error {
	if db.closed.Load() {
		return ErrClosed
	}
	db.mu.Lock()
	t := db.tables[name]
	db.mu.Unlock()
	if t == nil {
		return nil
	}
	return db.forget(ctx, t)
}

// forget makes the node forget t's table: txncoord.Forget, whose doc states the contract.
func (t *Table) forget(ctx context.Context) error {
	if t.db.closed.Load() {
		return ErrClosed
	}
	return t.db.forget(ctx, t.t)
}

// forget is Table.forget of state t (see above), one at a time in the DB: a forget that failed
// reopens the table to commits, which must not undo the close of another one flushing (its
// flush would not cover the commits admitted since, and in WriteBack their frames would be
// dropped unwritten).
func (db *DB) forget(ctx context.Context, t *tableState) error {
	db.mu.Lock()
	if db.forgetting == nil {
		db.forgetting = make(chan struct{}, 1)
	}
	sem := db.forgetting
	db.mu.Unlock()
	select {
	case sem <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("txnode: forget table %q: %w (not forgotten)", t.name, ctx.Err())
	}
	defer func() { <-sem }()
	if t.dropped.Load() {
		return nil
	}
	// forgotten closes the table to commits (droppingErr: ErrForgotten) with closeTable's
	// barrier, a flag of its own: a DropTable that fails reopens what it closed (dropping),
	// never this close. Reads are served until dropped is set.
	db.pipe.closeWrites(&t.forgotten, true)
	err := db.pipe.flush(ctx)
	if err == nil {
		err = ctx.Err() // ended during the flush: the caller's next step would fail; kept
	}
	if err != nil {
		db.pipe.closeWrites(&t.forgotten, false)
		return fmt.Errorf("txnode: forget table %q: its commits are not durable yet: %w (not forgotten)", t.name, err)
	}
	db.mu.Lock()
	if db.tables[t.name] != t {
		// Dropped meanwhile (DropTable): its frames and grant went with it.
		t.forgotten.Store(false)
		db.mu.Unlock()
		return nil
	}
	delete(db.tables, t.name)
	delete(db.byID, t.id)
	db.stats.retire(t)
	if db.forgottenIDs == nil {
		db.forgottenIDs = make(map[uint32]struct{})
	}
	db.forgottenIDs[t.id] = struct{}{}
	// dropped, after forgotten: serving tells a forgotten state from a dropped one, and
	// every check of dropped (pins, renewals, latches, transactions) stops the state.
	t.dropped.Store(true)
	db.mu.Unlock()
	db.cache.dropTable(t.id)
	if t.grantRelease != nil {
		if rerr := t.grantRelease(ctx); rerr != nil {
			return fmt.Errorf("txnode: forget table %q: release its etcd grant: %w (forgotten all the same)", t.name, rerr)
		}
	}
	return nil
}

// forgottenFrames drops the cached frames of table id again when this node forgot a state
// of it before (adopt, once the new grant is registered with the store, before the new
// state is shared): a reader of the forgotten state that checked it before the forget may
// have made a frame of it since, filled with rows older than the new grant.
func (db *DB) forgottenFrames(id uint32) {
	db.mu.Lock()
	_, ok := db.forgottenIDs[id]
	delete(db.forgottenIDs, id)
	db.mu.Unlock()
	if ok {
		db.cache.dropTable(id)
	}
}

// forgottenErr is the error of every use of forgotten state t.
func (t *tableState) forgottenErr() error {
	return fmt.Errorf("%w: %q (%w): open it again to acquire it afresh", ErrLeaseExpired, t.name, ErrForgotten)
}
