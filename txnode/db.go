package txnode

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weftdb/weft/internal/assert"
	"github.com/weftdb/weft/logicpage"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/txnode/store"
)

// DB is an open transaction node: a CRUD and transaction API over fixed-size rows, served from
// a logical page cache, backed by a store (store.Store). Its methods may be called from any goroutine.
type DB struct {
	opts  Options
	store store.Store
	// remote is store when it is a storage node at Options.StoreAddr (outages: health.go),
	// else nil.
	remote *remoteStore
	// renewNow starts a round of renewals before the next tick (renewLeases): the storage
	// node is back after an outage, and the leases that lapsed meanwhile are renewed at once.
	renewNow chan struct{}
	info     store.Info
	owner    uint64
	cache    *pageCache
	pipe     *pipeline

	// commitVer is the monotonic commit counter: row and page versions come from it.
	commitVer atomic.Uint64
	_         [56]byte // durableVer, which every Durable Get reads, is not on commitVer's line
	// durableVer: every commit with a version <= it is acknowledged by the store.
	durableVer atomic.Uint64
	// failHi is the highest version of a failed range (failRanges); 0 when none. On
	// durableVer's line: a Durable read loads both.
	failHi    atomic.Uint64
	_         [48]byte // nor on durableMu's
	durableMu sync.Mutex
	// durableWaiters wait for durableVer to reach their version. durableFailVer: no version
	// from it on will become durable (a batch holding it failed); max when none.
	durableWaiters []*durableWaiter
	durableFailVer uint64
	// failRanges are the ranges of versions whose batches the store refused and the pipeline
	// recovered from (pipeline.recover): never durable, though durableVer passes them.
	// Copy-on-write under durableMu; at most failRangesMax.
	failRanges atomic.Pointer[[]verRange]
	// held are the versions of batches that were in flight after a refused one (recover.go):
	// their committers (waitCommitted) are answered only once the batch is back, though the
	// failed range fails their readers at once. Under durableMu; at most heldMax.
	held []heldVers
	// batchFailed: a commit batch failed (failDurable ran), set before the failed rows are
	// invalidated. From then on a fill stamps fresh versions (see fill).
	batchFailed atomic.Bool

	// mu guards tables and byID. It is a leaf lock: nothing else is taken while it is held
	// (freshNow takes it under the cache's mutex).
	mu     sync.Mutex
	tables map[string]*tableState
	byID   map[uint32]*tableState
	// adopting holds a channel per table name being adopted (closed when that adopt ends):
	// a concurrent open of the same table waits for it instead of taking the grant again.
	// Guarded by mu.
	adopting map[string]chan struct{}
	// grantsReleased is set (under mu) once Close gave up the etcd grants: an adopt that
	// registers later gives its own up at once (ErrClosed).
	grantsReleased bool

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
	stop      chan struct{}
	bg        sync.WaitGroup

	txPool sync.Pool
	stats  dbCounters

	// testHookAdded, when set (by a test, before any commit), runs in a committing
	// goroutine between the pipeline's add and the install.
	testHookAdded func(tx *Tx)
	// testHookGet, when set (by a test, before any Get), runs in Table.Get's lock-free path
	// before and after it copies the row.
	testHookGet func()
	// testHookBumped, when set (by a test, before any commit), runs in a committing
	// goroutine that inserts, between its insert-epoch bumps and its validation.
	testHookBumped func(tx *Tx)
	// testHookWait, when set (by a test, before any commit), runs in a goroutine about to
	// wait for acknowledgements: what is "durable" (waitDurable) or "settle" (a fetch of a
	// row whose evicted frame had it in flight: pipeline.waitSettled) or "seqgap" (a
	// prepare refused for a seq gap, waiting for the batches before it: seqGapRecovering).
	testHookWait func(what string)
}

// tableState is what the node knows of a table. Immutable fields first.
type tableState struct {
	id       uint32
	name     string
	geo      logicpage.Geometry
	rowBytes int

	epoch atomic.Uint64
	// grantCheck, for a cluster-managed table, is its etcd grant's check (Options.Grants),
	// in place of leaseUntil, and grantRelease gives the grant up (Close); nil for a local
	// table. Set before the table is shared.
	grantCheck   func() error
	grantRelease func(context.Context) error
	// layout is a cluster-managed table's layout and partition (Partitions 0: local).
	layout store.ClusterLayout
	// storeFenced, for a cluster-managed table, latches the store's refusal of this node's
	// grant (ErrFenced on an id grant or a commit batch: a newer grant is registered there,
	// or the store is a restored copy whose floor is above it): no check of the grant makes
	// it current again, so the table stops serving, as a local table whose renewal the store
	// refused. noteFenced sets it.
	storeFenced atomic.Bool
	// storeGone, set before storeFenced, says the store has no such table any more (dropped
	// there: renewGrant's ErrTableNotFound): the table serves ErrTableNotFound.
	storeGone atomic.Bool
	// leaseUntil is when this node stops trusting its ownership, on clock (monotonic
	// nanoseconds, never the wall clock: a wall clock stepped back would stretch the lease);
	// 0 = never expires, leaseLapsed once serving saw it run out (until a renewal).
	leaseUntil atomic.Int64
	clock      leaseClock
	renewing   atomic.Bool // a renewal of the lease is running (renewLease)
	dropped    atomic.Bool
	// dropping closes the table to new commits while DropTable flushes what was admitted
	// before; set under the pipeline's mu (see pipeline.add), reads keep working.
	dropping atomic.Bool
	// idHigh is one past the highest id that can hold a row: the store's high-water mark
	// at open, raised by every grant. Read by every Get: it and the fields above are
	// read-mostly, the fields below are written by commits and misses (another line).
	idHigh atomic.Uint64
	_      [64]byte

	// insertEpoch is bumped by every commit that inserts rows, with its write set locked and
	// before it validates (Silo): a scan or Get reaching into ids this node may still insert
	// records it, so an insert there before it commits is a phantom (validation fails).
	insertEpoch atomic.Uint64
	// grantLo is the first id granted to this node in this run; max when none.
	grantLo atomic.Uint64
	// runs detects sequential readers among a table's cache misses (read.go).
	runs missRuns

	ids idAllocator

	// cnt counts the table's cache hits and misses (tablestats.go).
	cnt tableCounters
}

// Open opens a transaction node over the store Options name: the embedded store in Dir, a
// storage node at StoreAddr, or Options.Store.
func Open(ctx context.Context, opts Options) (*DB, error) {
	opts = opts.withDefaults()
	if err := opts.checkPinBytes(); err != nil {
		return nil, err
	}
	for opts.OwnerID == 0 {
		var b [8]byte
		rand.Read(b[:])
		opts.OwnerID = binary.LittleEndian.Uint64(b[:])
	}
	st := opts.Store
	switch {
	case st != nil && (opts.Dir != "" || opts.StoreAddr != ""),
		opts.Dir != "" && opts.StoreAddr != "",
		st == nil && opts.Dir == "" && opts.StoreAddr == "":
		return nil, errors.New("txnode: set exactly one of Options.Dir, Options.StoreAddr and Options.Store")
	case opts.Dir != "":
		sync, ok := storenode.ParseSyncMode(opts.SyncMode)
		if !ok {
			return nil, fmt.Errorf("txnode: sync mode %q: want always or none", opts.SyncMode)
		}
		s, err := store.OpenEmbedded(storenode.Options{Dir: opts.Dir, Sync: sync, CacheBytes: opts.StoreCacheBytes,
			Logger: opts.Logger, ExpireLeasesAtOpen: true})
		if err != nil {
			return nil, err
		}
		st = s
	case opts.StoreAddr != "":
		s, err := dialStore(ctx, opts)
		if err != nil {
			return nil, err
		}
		st = s
	}
	db := &DB{
		opts:     opts,
		store:    st,
		info:     st.Info(),
		owner:    opts.OwnerID,
		cache:    newPageCache(opts.CacheBytes, opts.CacheWait),
		tables:   make(map[string]*tableState),
		byID:     make(map[uint32]*tableState),
		adopting: make(map[string]chan struct{}),
		stop:     make(chan struct{}),
		renewNow: make(chan struct{}, 1),

		durableFailVer: math.MaxUint64,
	}
	db.pipe = newPipeline(db)
	db.cache.needFlush = db.pipe.flushSoon
	db.cache.freshNow = db.freshNow
	db.cache.tp.budget = opts.PinBytes
	db.txPool.New = func() any { return &Tx{db: db} }
	if rs, ok := st.(*remoteStore); ok {
		db.remote = rs
		rs.mu.Lock()
		rs.onUnavailable = db.pipe.wakeRoom
		rs.onBack = db.renewSoon
		rs.mu.Unlock()
	}
	if db.info.Lease > 0 || opts.Grants != nil {
		db.bg.Add(1)
		go db.renewLeases()
	}
	return db, nil
}

// Close flushes and waits for every commit, then closes the store. It is idempotent. It waits
// only as long as ctx allows: if ctx ends first it returns ctx's error, and commits whose
// batches were not acknowledged by then return an error wrapping ErrUnknownOutcome (the
// store may still apply them).
func (db *DB) Close(ctx context.Context) error {
	db.closeOnce.Do(func() {
		err := db.pipe.close(ctx)
		db.releaseGrants(ctx)
		db.closed.Store(true)
		close(db.stop)
		db.bg.Wait()
		if cerr := db.store.Close(); err == nil {
			err = cerr
		}
		db.closeErr = err
	})
	return db.closeErr
}

// releaseGrants gives up the etcd grants of the cluster-managed tables (Close, after the
// pipeline's last batch): another node takes them at once, not a TTL later.
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

// Owner returns this node's owner id.
func (db *DB) Owner() uint64 { return db.owner }

// CreateTable creates a table of rowBytes-byte rows (8..4096, a multiple of 8) and takes its
// write ownership.
func (db *DB) CreateTable(ctx context.Context, name string, rowBytes int) (*Table, error) {
	if db.closed.Load() {
		return nil, ErrClosed
	}
	st, err := db.store.CreateTable(ctx, name, rowBytes)
	if err != nil {
		return nil, err
	}
	return db.adopt(ctx, st)
}

// Table opens an existing table and takes its write ownership (waiting for no one: if another
// node holds a live lease it fails with ErrTableOwned).
func (db *DB) Table(ctx context.Context, name string) (*Table, error) {
	if db.closed.Load() {
		return nil, ErrClosed
	}
	db.mu.Lock()
	t := db.tables[name]
	db.mu.Unlock()
	if t != nil {
		return &Table{db: db, t: t}, nil
	}
	st, err := db.store.OpenTable(ctx, name)
	if err != nil {
		return nil, err
	}
	return db.adopt(ctx, st)
}

// adopt acquires a table's ownership and registers it. One adopt of a name at a time: a
// concurrent one waits for it (within ctx) and returns the table it opened. Otherwise it
// would take the grant a second time: a local table's epoch bumped past the one the first
// adopt installs, or, for a cluster table, the very etcd grant the first one holds (the
// session hands it out again), released if the second registration fails.
func (db *DB) adopt(ctx context.Context, st store.Table) (*Table, error) {
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
	var g store.Grant
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
	t := &tableState{id: st.ID, name: st.Name, geo: geo, rowBytes: st.RowBytes, clock: db.opts.clock,
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
// Options.Grants and registers it with the store, which verifies it in etcd before it
// answers. The partitioned table's name is st's name without its partition suffix
// (storenode.PartitionTableName). A grant the store fences (a restored copy's floor is above
// it, or a newer grant was registered meanwhile) is released and taken again once, as a new
// grant with a higher epoch; a grant the store does not take is released. A partition with
// transactions in doubt is waited for (registerClusterGrant), holding the grant.
func (db *DB) acquireCluster(ctx context.Context, st store.Table) (store.Grant, func() error, func(context.Context) error, error) {
	if db.opts.Grants == nil {
		return store.Grant{}, nil, nil, fmt.Errorf("txnode: table %q is cluster-managed: its grants come from etcd, and Options.Grants is not set", st.Name)
	}
	base, ok := strings.CutSuffix(st.Name, storenode.PartitionTableName("", st.Cluster.Partition))
	if !ok || base == "" {
		return store.Grant{}, nil, nil, fmt.Errorf("txnode: cluster-managed table %q is not named for its partition %d", st.Name, st.Cluster.Partition)
	}
	for try := 0; ; try++ {
		epoch, check, release, err := db.opts.Grants.Grant(ctx, base, st.Cluster.Partition)
		if err != nil {
			return store.Grant{}, nil, nil, fmt.Errorf("txnode: table %q partition %d: %w", base, st.Cluster.Partition, err)
		}
		g, err := db.registerClusterGrant(ctx, st, epoch, check)
		if err == nil {
			return g, check, release, nil
		}
		if rerr := release(ctx); rerr != nil {
			db.opts.Logger.Warn("txnode: release of an etcd grant the store refused", "table", st.Name, "err", rerr)
		}
		if try > 0 || !errors.Is(err, storenode.ErrFenced) {
			return store.Grant{}, nil, nil, err
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
func (db *DB) registerClusterGrant(ctx context.Context, st store.Table, epoch uint64, check func() error) (store.Grant, error) {
	wait := txnLockedWaitFirst
	for {
		g, err := db.store.Acquire(ctx, st.ID, db.owner, epoch, store.AcquireEtcdGrant)
		if err == nil || !errors.Is(err, storenode.ErrTxnLocked) {
			return g, err
		}
		if cerr := check(); cerr != nil {
			return store.Grant{}, fmt.Errorf("txnode: table %q: the grant ended while waiting for transactions in doubt: %w", st.Name, cerr)
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
			return store.Grant{}, fmt.Errorf("txnode: table %q: %w (waiting for transactions in doubt: %w)", st.Name, ctx.Err(), err)
		case <-db.stop:
			stop()
			return store.Grant{}, ErrClosed
		}
		wait = min(2*wait, txnLockedWaitMax)
	}
}

// CreateClusterTable creates a cluster-managed table holding partition layout.Partition of
// the partitioned table table (its name at the store: storenode.PartitionTableName) and
// takes its write ownership through Options.Grants.
func (db *DB) CreateClusterTable(ctx context.Context, table string, rowBytes int, layout ClusterLayout) (*Table, error) {
	if db.closed.Load() {
		return nil, ErrClosed
	}
	st, err := db.store.CreateClusterTable(ctx, storenode.PartitionTableName(table, layout.Partition), rowBytes, layout)
	if err != nil {
		return nil, err
	}
	return db.adopt(ctx, st)
}

// ClusterLayout is a cluster-managed table's layout (cluster.Layout) and the partition a
// table holds.
type ClusterLayout = store.ClusterLayout

// freshNow is the cache's pageCache.freshNow: the slots of a page whose ids this node has
// not handed out yet.
func (db *DB) freshNow(key uint64) uint64 {
	db.mu.Lock()
	t := db.byID[uint32(key>>32)]
	db.mu.Unlock()
	if t == nil {
		return 0
	}
	return t.ids.freshOf(key & (1<<32 - 1))
}

// leaseUsable is how long after a grant request this node trusts its lease: a margin below
// the lease for clock drift and delays, so it stops serving before the storage node could
// grant the table to someone else.
func leaseUsable(lease time.Duration) time.Duration { return lease * 3 / 4 }

// TableInfo describes a table as the store knows it (DB.Tables).
type TableInfo struct {
	// ID is the table's id in the store (Table.ID).
	ID   uint32
	Name string
	// RowBytes is the row size.
	RowBytes int
	// NextID is the table's id high-water mark: no row lives at or above it.
	NextID uint64
}

// Tables lists the store's tables, in id order.
func (db *DB) Tables(ctx context.Context) ([]TableInfo, error) {
	if db.closed.Load() {
		return nil, ErrClosed
	}
	ts, err := db.store.ListTables(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]TableInfo, len(ts))
	for i, t := range ts {
		out[i] = TableInfo{ID: t.ID, Name: t.Name, RowBytes: t.RowBytes, NextID: t.NextID}
	}
	slices.SortFunc(out, func(a, b TableInfo) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

// DropTable deletes a table and all its rows. It first closes the table to new commits
// (they fail with ErrTableNotFound, alone: other tables keep working), then flushes and waits
// for the commits admitted before, so none reaches the store after the drop, then drops it
// at the store. A name this node has not opened is dropped at the store directly (nothing
// of it can be in flight here): ErrTableNotFound if it does not exist. If the drop fails
// (ctx, the store) the table stays usable.
func (db *DB) DropTable(ctx context.Context, name string) error {
	if db.closed.Load() {
		return ErrClosed
	}
	db.mu.Lock()
	t := db.tables[name]
	db.mu.Unlock()
	if t == nil {
		return db.store.DropTable(ctx, name, db.owner)
	}
	db.pipe.closeTable(t, true)
	if err := db.pipe.flush(ctx); err != nil {
		db.pipe.closeTable(t, false)
		return err
	}
	err := db.store.DropTable(ctx, name, db.owner)
	if err != nil && !errors.Is(err, ErrTableNotFound) {
		db.pipe.closeTable(t, false)
		return err
	}
	// Dropped (by this call, or already: then ErrTableNotFound, after the cleanup).
	db.mu.Lock()
	owned := db.tables[name] == t
	if owned {
		delete(db.tables, name)
		delete(db.byID, t.id)
		db.stats.retire(t)
	}
	t.dropped.Store(true)
	db.mu.Unlock()
	db.cache.dropTable(t.id)
	if owned && t.grantRelease != nil {
		// A cluster table's etcd grant goes with it: held, it would keep another node
		// from the partition until this node's session ends.
		if rerr := t.grantRelease(ctx); rerr != nil {
			db.opts.Logger.Warn("txnode: release of a dropped table's etcd grant", "table", name, "err", rerr)
		}
	}
	return err
}

// renewLeases keeps every owned table's lease alive (remote stores only) and re-registers
// each cluster-managed table's etcd grant with its store (renewGrant): every quarter lease
// (GrantRecheckInterval for an embedded store, whose grants never expire) it starts a
// renewal of each table that has none running, each on a goroutine of its own, so a slow
// renewal delays no other table's.
func (db *DB) renewLeases() {
	defer db.bg.Done()
	period := db.info.Lease / 4
	if period <= 0 {
		period = GrantRecheckInterval
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

// GrantRecheckInterval is how often a transaction node over an embedded store re-registers
// the etcd grant of each cluster-managed table it serves (over a storage node: every quarter
// of the storage node's lease, with the lease renewals).
const GrantRecheckInterval = time.Second

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
		case errors.Is(err, storenode.ErrTableNotFound):
			t.storeGone.Store(true)
			t.storeFenced.Store(true)
		case errors.Is(err, storenode.ErrFenced):
			t.storeFenced.Store(true)
		}
		select {
		case <-db.stop: // Close ended it: nothing failed
		default:
			if droppedHere(t, err) {
				return
			}
			db.stats.renewFails.Add(1)
			if !db.outageErr(err) {
				db.opts.Logger.Warn("txnode: re-registration of an etcd grant failed", "table", t.name, "err", err)
			}
		}
		return
	}
	db.stats.renewals.Add(1)
}

// droppedHere reports whether err, a renewal's or re-registration's, says the store has no
// such table because this node's DropTable is dropping it (or dropped it) meanwhile: the
// renewal raced the drop, nothing failed.
func droppedHere(t *tableState, err error) bool {
	return errors.Is(err, storenode.ErrTableNotFound) && (t.dropping.Load() || t.dropped.Load())
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
		if errors.Is(err, storenode.ErrFenced) || errors.Is(err, storenode.ErrTableNotFound) {
			// The store granted the table since (another owner, or a restored
			// backup's epoch bump), or has no such table (dropped by another
			// node, or a restored backup older than the table): this node's
			// cache may hold rows the store does not, so it stops serving the
			// table at once, not at lease end.
			t.leaseUntil.Store(leaseLapsed)
		}
		select {
		case <-db.stop: // Close ended it: nothing failed
		default:
			if droppedHere(t, err) {
				return
			}
			db.stats.renewFails.Add(1)
			if !db.outageErr(err) {
				db.opts.Logger.Warn("txnode: lease renewal failed", "table", t.name, "err", err)
			}
		}
		return
	}
	t.leaseUntil.Store(start + int64(leaseUsable(g.Lease)))
	db.stats.renewals.Add(1)
}

// serving reports whether this node may serve t: not dropped, lease live.
func (t *tableState) serving() error {
	if t.dropped.Load() {
		return fmt.Errorf("%w: %q was dropped", ErrTableNotFound, t.name)
	}
	if t.grantCheck != nil {
		if t.storeFenced.Load() {
			if t.storeGone.Load() {
				return fmt.Errorf("%w: %q was dropped at the store", ErrTableNotFound, t.name)
			}
			return fmt.Errorf("%w: %q: the store fenced this node's etcd grant (%w: a newer one is registered, or the store was restored): reopen the table under a new grant",
				ErrLeaseExpired, t.name, storenode.ErrFenced)
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
	if t.grantCheck != nil && errors.Is(err, storenode.ErrFenced) {
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

// durableWaiter is a goroutine in waitDurable. Waiters come from a pool and their channels
// are reused, so waiting allocates nothing: a waiter is woken (one send; the channel holds
// one) only after it was registered, and registered again only after it took the wake-up.
type durableWaiter struct {
	ver uint64
	ch  chan struct{}
}

var durableWaiterPool = sync.Pool{New: func() any { return &durableWaiter{ch: make(chan struct{}, 1)} }}

// waitDurable waits until every commit with version <= ver is acknowledged, or returns the
// pipeline's failure, the error of the failed range holding ver (verFailed), or ctx.Err().
func (db *DB) waitDurable(ctx context.Context, ver uint64) error {
	return db.waitVer(ctx, ver, 0, waitRead)
}

// waitCommitted is waitDurable for the committer of version ver, whose transaction read
// versions up to readVer: while ver is held (its batch was in flight after a refused one,
// recover.go) it waits for that batch's answer instead of returning the failed range's
// error at once, since a store that forgot the refusal may still apply the batch; then it
// returns the answer (heldVers.answer).
func (db *DB) waitCommitted(ctx context.Context, ver, readVer uint64) error {
	return db.waitVer(ctx, ver, readVer, waitCommit)
}

// waitOrdered is waitDurable for a Session's read-only Pending, which resolves no earlier
// than the session's write before it: while ver is held it waits for the batch's answer,
// then returns what waitDurable does (a failed range's error).
func (db *DB) waitOrdered(ctx context.Context, ver uint64) error {
	return db.waitVer(ctx, ver, 0, waitAfter)
}

// waitMode is what a wait in a failed range does with a held version (heldVers).
type waitMode uint8

const (
	waitRead   waitMode = iota // returns the range's error at once
	waitCommit                 // waits for the batch's answer and returns it
	waitAfter                  // waits for the batch's answer, then returns the range's error
)

func (db *DB) waitVer(ctx context.Context, ver, readVer uint64, mode waitMode) error {
	if db.durableVer.Load() >= ver {
		// verFailed is loaded after durableVer: a recovery adds its range first.
		if err := db.verFailed(ver); err == nil || mode == waitRead {
			return err
		}
	}
	w := durableWaiterPool.Get().(*durableWaiter)
	defer durableWaiterPool.Put(w)
	w.ver = ver
	for {
		db.durableMu.Lock()
		if err := db.verFailed(ver); err != nil {
			var h *heldVers
			if mode != waitRead {
				h = db.heldLocked(ver)
			}
			if h == nil || h.answered && mode == waitAfter { // not held (or refused)
				db.durableMu.Unlock()
				return err
			}
			if h.answered {
				ans := h.answer(ver, readVer)
				db.durableMu.Unlock()
				return ans
			}
			// Held and out: releaseHeld wakes it (so may others: it looks again).
		} else if db.durableVer.Load() >= ver {
			db.durableMu.Unlock()
			return nil
		} else if ver >= db.durableFailVer {
			// A batch before ver failed the pipeline for good; ver's own batch may still be
			// held (a refusal while closing, or past failRangesMax: recover.go).
			var h *heldVers
			if mode != waitRead {
				h = db.heldLocked(ver)
			}
			if h == nil || h.answered && mode == waitAfter {
				db.durableMu.Unlock()
				return db.pipe.failure()
			}
			if h.answered {
				ans := h.answer(ver, readVer)
				db.durableMu.Unlock()
				return ans
			}
		}
		db.durableWaiters = append(db.durableWaiters, w)
		db.durableMu.Unlock()
		db.pipe.kickNow()
		if db.testHookWait != nil {
			db.testHookWait("durable")
		}
		woken := false
		select {
		case <-w.ch:
			woken = true
		case <-ctx.Done():
		case <-db.outageC():
			// The storage node is unavailable: the batch is kept and resent on reconnect,
			// but nobody waits an outage out here.
		}
		if !woken {
			db.durableMu.Lock()
			if i := slices.Index(db.durableWaiters, w); i >= 0 {
				db.durableWaiters = slices.Delete(db.durableWaiters, i, i+1)
			} else {
				<-w.ch // woken meanwhile: take the wake-up, so the channel is empty for reuse
			}
			db.durableMu.Unlock()
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := db.unavailableErr(); err != nil {
				return err
			}
			// The outage ended meanwhile: look again.
		}
	}
}

// wakeLocked wakes w, which is registered and so has not been woken yet. Caller holds
// durableMu.
func (w *durableWaiter) wakeLocked() {
	select {
	case w.ch <- struct{}{}:
	default:
		assert.Failf("txnode: durable waiter woken twice")
	}
}

// advanceDurable raises durableVer and wakes the waiters it satisfies.
func (db *DB) advanceDurable(ver uint64) {
	db.durableMu.Lock()
	if ver > db.durableVer.Load() {
		db.durableVer.Store(ver)
		keep := db.durableWaiters[:0]
		for _, w := range db.durableWaiters {
			if w.ver <= ver {
				w.wakeLocked()
			} else {
				keep = append(keep, w)
			}
		}
		clear(db.durableWaiters[len(keep):])
		db.durableWaiters = keep
	}
	db.durableMu.Unlock()
}

// failDurable records that no version from fromVer on will become durable (a batch failed)
// and wakes the waiters for them, which return the pipeline's failure.
func (db *DB) failDurable(fromVer uint64) {
	db.batchFailed.Store(true)
	db.durableMu.Lock()
	db.durableFailVer = min(db.durableFailVer, fromVer)
	keep := db.durableWaiters[:0]
	for _, w := range db.durableWaiters {
		if w.ver >= db.durableFailVer {
			w.wakeLocked()
		} else {
			keep = append(keep, w)
		}
	}
	clear(db.durableWaiters[len(keep):])
	db.durableWaiters = keep
	db.durableMu.Unlock()
}

// heldVers are the versions of a batch that was in flight after a refused one (recover.go):
// the failed range fails their readers at once, but their committers wait for the batch's
// answer, since a storage node that forgot the refusal (refusals are kept in memory only,
// and bounded) may apply it.
type heldVers struct {
	lo, hi uint64
	// answered: the batch is back, or never will be (Close gave up on it). A batch refused
	// (not applied) is no longer held: its committers get the range's error.
	answered bool
	// err is the answer; nil: acknowledged, applied and durable (see okBelow).
	err error
	// okBelow (acknowledged): the lowest version of a batch before it that was not applied
	// or whose outcome is unknown: a transaction that read a version from it on read rows
	// that may never have been applied.
	okBelow uint64
}

// answer is what the committer of version ver, whose transaction read versions up to
// readVer, gets for the answered batch h.
func (h *heldVers) answer(ver, readVer uint64) error {
	if h.err != nil || readVer < h.okBelow {
		return h.err
	}
	return fmt.Errorf("%w: commit version %d was applied by the store after an earlier batch of this node was refused, but the transaction read version %d, which may not have been: do not run it again unless it is idempotent",
		ErrUnknownOutcome, ver, readVer)
}

// heldMax bounds db.held: a refusal holds at most inflightMax batches, an entry goes
// once its batch is refused, and one stays answered only once the pipeline failed for good.
const heldMax = 2 * inflightMax

// heldLocked returns the held batch holding ver, nil when none. Caller holds durableMu.
func (db *DB) heldLocked(ver uint64) *heldVers {
	for i := range db.held {
		if h := &db.held[i]; ver >= h.lo && ver <= h.hi {
			return h
		}
	}
	return nil
}

// holdVers records lo..hi as held: their committers wait for releaseHeld. Called under the
// pipeline's mu, before the failed range holding them is recorded.
func (db *DB) holdVers(lo, hi uint64) {
	db.durableMu.Lock()
	db.held = append(db.held, heldVers{lo: lo, hi: hi})
	assert.That(len(db.held) <= heldMax, "txnode: too many held commit batches")
	db.durableMu.Unlock()
}

// releaseHeld answers the committers of the held versions lo..hi and wakes them: refused,
// they get the failed range's error (the hold is dropped); else ans (nil: acknowledged, with
// okBelow: see heldVers). The hold is found by lo alone: a part applied since (prepare.go's
// installApplied) may have raised the batch's lastVer past the hold's hi. Called under the
// pipeline's mu.
func (db *DB) releaseHeld(lo, hi uint64, refused bool, ans error, okBelow uint64) {
	db.durableMu.Lock()
	defer db.durableMu.Unlock()
	for i := range db.held {
		if h := &db.held[i]; h.lo == lo && !h.answered {
			if refused {
				db.held = slices.Delete(db.held, i, i+1)
			} else {
				h.answered, h.err, h.okBelow = true, ans, okBelow
			}
			break
		}
	}
	keep := db.durableWaiters[:0]
	for _, w := range db.durableWaiters {
		if w.ver >= lo && w.ver <= hi {
			w.wakeLocked()
		} else {
			keep = append(keep, w)
		}
	}
	clear(db.durableWaiters[len(keep):])
	db.durableWaiters = keep
}

// verRange is a range of commit versions that failed: their batches were refused by the
// store (not applied) and the pipeline went on (pipeline.recover).
type verRange struct {
	lo, hi uint64
	err    error
}

// failRangesMax bounds the failed ranges a DB keeps: a refusal past it fails the pipeline for
// good, as any failed batch did before recoveries (reopen the DB).
const failRangesMax = 64

// verFailed returns the error of the failed range holding ver, nil when none. Lock-free; any
// goroutine. A caller that found ver durable must load durableVer before calling it.
func (db *DB) verFailed(ver uint64) error {
	if ver > db.failHi.Load() {
		return nil
	}
	if rs := db.failRanges.Load(); rs != nil {
		for _, r := range *rs {
			if ver >= r.lo && ver <= r.hi {
				return r.err
			}
		}
	}
	return nil
}

// failedFloor returns ver, or, while ver is in a failed range, the version below that range.
func (db *DB) failedFloor(ver uint64) uint64 {
	for ver > 0 && ver <= db.failHi.Load() {
		rs := db.failRanges.Load()
		if rs == nil {
			break
		}
		moved := false
		for _, r := range *rs {
			if ver >= r.lo && ver <= r.hi {
				ver, moved = r.lo-1, true
			}
		}
		if !moved {
			break
		}
	}
	return ver
}

// failRange records that the versions lo..hi will never be durable, though durableVer may
// pass them (the pipeline recovers), and wakes their waiters, which return err. It reports
// false, recording nothing, when failRangesMax ranges are kept already.
func (db *DB) failRange(lo, hi uint64, err error) bool {
	db.durableMu.Lock()
	defer db.durableMu.Unlock()
	var rs []verRange
	if old := db.failRanges.Load(); old != nil {
		if len(*old) >= failRangesMax {
			return false
		}
		rs = append(rs, *old...)
	}
	rs = append(rs, verRange{lo: lo, hi: hi, err: err})
	db.failRanges.Store(&rs)
	db.failHi.Store(max(db.failHi.Load(), hi))
	keep := db.durableWaiters[:0]
	for _, w := range db.durableWaiters {
		if w.ver >= lo && w.ver <= hi {
			w.wakeLocked()
		} else {
			keep = append(keep, w)
		}
	}
	clear(db.durableWaiters[len(keep):])
	db.durableWaiters = keep
	return true
}

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
		case errors.Is(err, storenode.ErrTableNotFound):
			t.storeGone.Store(true)
			t.storeFenced.Store(true)
			return true, nil
		case errors.Is(err, storenode.ErrFenced):
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
	case errors.Is(err, storenode.ErrFenced) || errors.Is(err, storenode.ErrTableNotFound) || errors.Is(err, storenode.ErrTableOwned):
		t.leaseUntil.Store(leaseLapsed)
		return true, nil
	}
	return false, err
}
