package txnode

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/logicpage"
	"github.com/weftdb/weft/txnode/store"
)

// Adoption: a table's grant taken (a local table's epoch, or a cluster table's etcd grant
// registered with the store, waiting out its transactions in doubt) and the table registered
// with the node; the etcd grants given up at Close.

// releaseGrants gives up the etcd grants of the cluster-managed tables (Close, after the
// pipeline's last batch): another node takes them at once, not a TTL later.
// tableSerials numbers the table states this process makes (tableState.serial).
var tableSerials atomic.Uint64

func (db *DB) releaseGrants(ctx context.Context) {
	db.mu.Lock()
	db.grantsReleased = true
	var rel []func(context.Context) error
	for _, t := range db.byID {
		if t.grantRelease != nil {
			rel = append(rel, t.grantRelease)
		}
	}
	db.mu.Unlock()
	for _, r := range rel {
		if err := r(ctx); err != nil {
			db.opts.Logger.Warn("txnode: release of an etcd grant", "err", err)
		}
	}
}

// adopt acquires a table's ownership and registers it. One adopt of a name at a time: a
// concurrent one waits for it (within ctx) and returns the table it opened. Otherwise it
// would take the grant a second time: a local table's epoch bumped past the one the first
// adopt installs, or, for a cluster table, the very etcd grant the first one holds (the
// session hands it out again), released if the second registration fails.
func (db *DB) adopt(ctx context.Context, st base.TableInfo) (*Table, error) {
	geo, err := logicpage.NewGeometry(st.RowBytes)
	if err != nil {
		return nil, err
	}
	for {
		db.mu.Lock()
		if t := db.tables[st.Name]; t != nil {
			db.mu.Unlock()
			return &Table{db: db, t: t}, nil
		}
		busy, ok := db.adopting[st.Name]
		if !ok {
			db.adopting[st.Name] = make(chan struct{})
			db.mu.Unlock()
			break
		}
		db.mu.Unlock()
		select {
		case <-busy:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	defer func() {
		db.mu.Lock()
		close(db.adopting[st.Name])
		delete(db.adopting, st.Name)
		db.mu.Unlock()
	}()
	start := db.opts.clock.nanos()
	var g base.Grant
	var check func() error
	var release func(context.Context) error
	if st.Cluster.Partitions != 0 {
		g, check, release, err = db.acquireCluster(ctx, st)
	} else {
		g, err = db.store.Acquire(ctx, st.ID, db.owner, 0, 0)
	}
	if err != nil {
		return nil, err
	}
	// The pipeline's seq first, with db.mu not held: db.mu is a leaf lock (the cache's
	// frame creation takes it, under the cache's mutex, in freshNow; a completing batch
	// takes the cache's mutex under the pipeline's), so it is never held while taking another.
	db.pipe.noteLastSeq(g.LastSeq)
	db.forgottenFrames(st.ID)
	db.mu.Lock()
	if db.grantsReleased && release != nil {
		// Close gave up the grants already, without this one: give it up here, or it
		// stays held until the session ends.
		db.mu.Unlock()
		if rerr := release(ctx); rerr != nil {
			db.opts.Logger.Warn("txnode: release of an etcd grant taken while closing", "table", st.Name, "err", rerr)
		}
		return nil, ErrClosed
	}
	defer db.mu.Unlock()
	if t := db.tables[st.Name]; t != nil {
		return &Table{db: db, t: t}, nil
	}
	t := &tableState{id: st.ID, name: st.Name, serial: tableSerials.Add(1), geo: geo, rowBytes: st.RowBytes, clock: db.opts.clock,
		grantCheck: check, grantRelease: release, layout: st.Cluster}
	t.epoch.Store(g.Epoch)
	if g.Lease > 0 && check == nil {
		t.leaseUntil.Store(start + int64(leaseUsable(g.Lease)))
	}
	t.grantLo.Store(^uint64(0))
	t.idHigh.Store(st.NextID)
	t.runs.init()
	t.ids.table = t
	db.tables[st.Name] = t
	db.byID[st.ID] = t
	return &Table{db: db, t: t}, nil
}

// acquireCluster takes the etcd grant of a cluster-managed table's partition from
// the node's grants (txncoord.Open) and registers it with the store, which verifies it in etcd before it
// answers. The partitioned table's name is st's name without its partition suffix
// (base.PartitionTableName). A grant the store fences (a restored copy's floor is above
// it, or a newer grant was registered meanwhile) is released and taken again once, as a new
// grant with a higher epoch; a grant the store does not take is released. A partition with
// transactions in doubt is waited for (registerClusterGrant), holding the grant.
func (db *DB) acquireCluster(ctx context.Context, st base.TableInfo) (base.Grant, func() error, func(context.Context) error, error) {
	if db.opts.grants == nil {
		return base.Grant{}, nil, nil, fmt.Errorf("txnode: table %q is cluster-managed: its grants come from etcd, and this node has none (txncoord.Open)", st.Name)
	}
	parted, ok := strings.CutSuffix(st.Name, base.PartitionTableName("", st.Cluster.Partition))
	if !ok || parted == "" {
		return base.Grant{}, nil, nil, fmt.Errorf("txnode: cluster-managed table %q is not named for its partition %d", st.Name, st.Cluster.Partition)
	}
	for try := 0; ; try++ {
		epoch, check, release, err := db.opts.grants.Grant(ctx, parted, st.Cluster.Partition)
		if err != nil {
			return base.Grant{}, nil, nil, fmt.Errorf("txnode: table %q partition %d: %w", parted, st.Cluster.Partition, err)
		}
		g, err := db.registerClusterGrant(ctx, st, epoch, check)
		if err == nil {
			return g, check, release, nil
		}
		if rerr := release(ctx); rerr != nil {
			db.opts.Logger.Warn("txnode: release of an etcd grant the store refused", "table", st.Name, "err", rerr)
		}
		if try > 0 || !errors.Is(err, ErrFenced) {
			return base.Grant{}, nil, nil, err
		}
	}
}

// The waits of a cluster table's registration for the store's transactions in doubt
// (registerClusterGrant): doubling from the first to the last, then every last.
const (
	txnLockedWaitFirst = 20 * time.Millisecond
	txnLockedWaitMax   = time.Second
)

// registerClusterGrant registers the etcd grant epoch of cluster table st with the store. A
// partition with transactions in doubt is granted to nobody until the storage node's resolver
// has settled them (storenode.ErrTxnLocked: a new owner would cache rows the decision may
// still change); the resolver does so on its own once their coordinator's lease is gone, so
// the registration waits for it, asking again with backoff (txnLockedWaitFirst doubling to
// txnLockedWaitMax, on Options' lockedTimer in tests), until the store takes the grant or
// refuses it otherwise, ctx ends (its error, wrapping the refusal), Close begins (ErrClosed)
// or the grant's check fails (it lapsed or was lost meanwhile: that error). Any goroutine but
// a connection's receiver.
func (db *DB) registerClusterGrant(ctx context.Context, st base.TableInfo, epoch uint64, check func() error) (base.Grant, error) {
	wait := txnLockedWaitFirst
	for {
		g, err := db.store.Acquire(ctx, st.ID, db.owner, epoch, store.AcquireEtcdGrant)
		if err == nil || !errors.Is(err, ErrTxnLocked) {
			return g, err
		}
		if cerr := check(); cerr != nil {
			return base.Grant{}, fmt.Errorf("txnode: table %q: the grant ended while waiting for transactions in doubt: %w", st.Name, cerr)
		}
		db.opts.Logger.Debug("txnode: registration waits for transactions in doubt", "table", st.Name, "wait", wait)
		var fired <-chan time.Time
		var stop func() bool
		if db.opts.lockedTimer != nil {
			fired, stop = db.opts.lockedTimer(wait)
		} else {
			t := time.NewTimer(wait)
			fired, stop = t.C, t.Stop
		}
		select {
		case <-fired:
		case <-ctx.Done():
			stop()
			return base.Grant{}, fmt.Errorf("txnode: table %q: %w (waiting for transactions in doubt: %w)", st.Name, ctx.Err(), err)
		case <-db.stop:
			stop()
			return base.Grant{}, ErrClosed
		}
		wait = min(2*wait, txnLockedWaitMax)
	}
}
