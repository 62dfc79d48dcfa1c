package txnode

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/logicpage"
	"github.com/weftdb/weft/txnode/internal/coordbridge"
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
	// forgottenIDs are the ids of tables whose state this node forgot (forget.go), until
	// the table is acquired again. Guarded by mu; nil until the first forget.
	forgottenIDs map[uint32]struct{}
	// forgetting is a one-slot semaphore: one forget at a time (forget.go). Made under mu
	// by the first forget.
	forgetting chan struct{}

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
	id   uint32
	name string
	// serial orders table states as they were made, process-wide (txncoord.Serial): of two
	// states of one partition on one storage node, the later one is the current one.
	serial   uint64
	geo      logicpage.Geometry
	rowBytes int

	epoch atomic.Uint64
	// grantCheck, for a cluster-managed table, is its etcd grant's check (txncoord.Open's grants),
	// in place of leaseUntil, and grantRelease gives the grant up (Close); nil for a local
	// table. Set before the table is shared.
	grantCheck   func() error
	grantRelease func(context.Context) error
	// layout is a cluster-managed table's layout and partition (Partitions 0: local).
	layout base.ClusterLayout
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
	// held closes the table to new commits while a partition move flushes what was
	// admitted before (txncoord.HoldWrites; hold.go); set and read as dropping is.
	held atomic.Bool
	// forgotten is set while forget (txncoord.Forget) forgets this state and for good once
	// it did (forget.go): its commits fail with ErrForgotten, and its reads too once dropped
	// is set.
	forgotten atomic.Bool
	// superseded is set, for good, once another table serves this one's partition
	// (txncoord.Supersede: a cluster node moved it, or healed it onto a new transaction
	// node): nothing writes this cache any more, so a read from it validates no longer.
	superseded atomic.Bool
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
		s, err := openEmbeddedStore(opts)
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
	if db.info.Lease > 0 || opts.grants != nil {
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

// openWithGrants is Open of a cluster's transaction node, whose cluster-managed tables are
// served under g's etcd grants (txncoord.Open).
func openWithGrants(ctx context.Context, opts Options, g coordbridge.Grants) (*DB, error) {
	if g == nil {
		return nil, errors.New("txncoord: Open without grants (a node without a cluster: txnode.Open)")
	}
	opts.grants = g
	return Open(ctx, opts)
}

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

// createClusterTable creates a cluster-managed table holding partition layout.Partition of
// the partitioned table table (its name at the store: base.PartitionTableName) and
// takes its write ownership through the node's grants (txncoord.CreateClusterTable).
func (db *DB) createClusterTable(ctx context.Context, table string, rowBytes int, layout base.ClusterLayout) (*Table, error) {
	if db.closed.Load() {
		return nil, ErrClosed
	}
	st, err := db.store.CreateClusterTable(ctx, base.PartitionTableName(table, layout.Partition), rowBytes, layout)
	if err != nil {
		return nil, err
	}
	return db.adopt(ctx, st)
}

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

// TableInfo describes a table as the store knows it (DB.Tables).
type TableInfo struct {
	// ID is the table's id in the store.
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
