package txnode

import (
	"context"
	"log/slog"
	"time"

	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/txnode/store"
)

// Durability says when a commit returns, and so what a crash loses.
//
// What is lost, by mode, when this process crashes or exits without DB.Close (returning from
// main without it, os.Exit, log.Fatal and a panic that ends the process are all crashes here:
// nothing flushes on the way out, so always `defer db.Close(ctx)` right after Open):
//
//   - Durable: nothing that returned nil. A commit returns only once the storage node has its
//     batch in the WAL (synced per the node's sync mode); what was still committing (no
//     return yet, or ErrUnknownOutcome) may or may not survive, whole. Session.Go returns
//     before durability: a Pending not yet resolved is in that state too.
//   - WriteBack: every commit not yet flushed, silently: the epochs of about the last
//     FlushInterval (more when the store is slow), and the epochs in flight. Each epoch
//     survives whole or not at all, and in order: what survives is the state after some
//     prefix of the commits. Session.Flush, Pending.Wait and Close wait for the flush.
//
// Close in both modes flushes, waits for every batch to be acknowledged and releases the
// store (the embedded store checkpoints; a remote store's tables become free for another
// node at once, while after a crash another node waits out the lease). The storage node's
// sync mode decides the rest: "always" survives power loss, "none" only a crash of either
// process (not of the machine or the OS).
type Durability uint8

const (
	// Durable (the default): a commit returns only after the storage node has the batch in its
	// WAL, synced per the node's sync mode. A transaction that read rows of a commit not yet
	// durable also waits for it, so nothing a caller saw can be lost by a crash.
	Durable Durability = iota
	// WriteBack: a commit returns once it is installed in the cache. Dirty rows are flushed in
	// epochs, each one atomic commit batch, every FlushInterval and when the cache needs room;
	// repeated writes to a row and rows of one page coalesce. A crash of this process, or an
	// exit without Close, loses the unflushed epochs (about the last FlushInterval of
	// commits), never part of one.
	WriteBack
)

// Defaults of Options.
const (
	DefaultCacheBytes     = 64 << 20
	DefaultFlushInterval  = 20 * time.Millisecond
	DefaultMaxRetries     = 64
	DefaultCacheWait      = 2 * time.Second
	DefaultInflightBytes  = 8 << 20
	DefaultRequestTimeout = 10 * time.Second
	DefaultDialTimeout    = 5 * time.Second
	// OwnerInUseMargin is added to a lease for the ErrOwnerInUse retries: the storage node
	// measures the holder's silence on its own clock, from its last renewal.
	OwnerInUseMargin = 2 * time.Second
	// ownerInUseLeaseFallback is the lease OwnerInUseWait's default assumes when the storage
	// node's own cannot be read.
	ownerInUseLeaseFallback = storenode.DefaultLeaseDuration
	DefaultStoreCacheBytes  = 256 << 20
	// MinCacheBytes is the smallest logical page cache.
	MinCacheBytes = 64 << 10
)

// Options configure Open. Zero fields take their defaults.
type Options struct {
	// Dir is the directory of the embedded store (an in-process storage engine, no TCP):
	// the default deployment. Exactly one of Dir, StoreAddr and Store must be set.
	Dir string
	// StoreAddr is the address of a storage node (host:port) to use over TCP.
	StoreAddr string
	// Store is a store to use as it is (tests, custom deployments, store.OpenEmbedded with
	// storenode.Options of your own); Close closes it. Most programs set Dir or StoreAddr.
	Store store.Store

	// Grants hands out the etcd grants of cluster-managed tables (docs/cluster.md): a table the
	// store reports as cluster-managed is served only under a grant from it (and fails to open
	// without it). Package cluster implements it on a Session (cluster.TxGrants); txnode does
	// not import cluster, so a node without a cluster links no etcd. Nil: no cluster.
	Grants Grants

	// CacheBytes is the hard budget of the logical page cache. It counts the frames (64 rows
	// and 64 version words each, rounded up to the allocator's size class), the per-frame
	// metadata (allocated 64 frames at a time, 4 KiB), the page table and a fixed part (the
	// chunk directory, 8 bytes per 64 frames the budget could hold, and 4 KiB of row-wait
	// shards). Not counted: a few hundred bytes of structs and 4 bytes per frame id in
	// free lists. At MinCacheBytes it holds 11 pages of 64-byte rows.
	CacheBytes int64
	// PinBytes is the pin budget: what the table pins (Table.Pin) may hold of the cache,
	// frameCost per page (a page's 64 rows and 64 version words, rounded up to the
	// allocator's size class). Zero: half of CacheBytes. At most three quarters of
	// CacheBytes (Open fails above): transactions need the rest (a transaction whose pages
	// do not fit beside the pinned ones fails with ErrCacheFull after CacheWait). Negative:
	// no table may be pinned. DB.Pin's page ranges are not counted (they are bounded by the
	// cache).
	PinBytes int64
	// CacheWait bounds how long a request waits for a frame when every frame is pinned or
	// dirty (WriteBack rows not yet flushed), before it fails with ErrCacheFull (a context that ends sooner ends
	// the wait sooner). It also bounds how long DB.Update keeps retrying a transaction that
	// found the cache full while it held pages (it parks for the cache turn meanwhile).
	CacheWait time.Duration
	// InflightBytes bounds what the commit batches not yet acknowledged hold: their rows
	// (the batches' own copies) and, per page segment, about 100 bytes of bookkeeping (the
	// segment, a frame reference and the ghost an evicted frame leaves). Frames whose rows
	// are in flight may be evicted (the batch owns its copy), so the cache does not bound
	// them: this does. A commit that would pass it waits for acknowledgements (its context
	// ends the wait: nothing applied); one larger than the bound is admitted alone, when
	// nothing else is in flight, and while it waits no other commit is admitted (so that a
	// stream of small ones cannot keep it out). WriteBack's flusher waits likewise before it
	// sends an epoch; a flush (Close, DropTable) waits for it only as long as its context
	// allows.
	InflightBytes int64
	// Durability is Durable (default) or WriteBack: see Durability for what a crash or a
	// missing Close loses in each.
	Durability Durability
	// FlushInterval is WriteBack's flush period.
	FlushInterval time.Duration
	// MaxRetries bounds how often DB.Update runs its closure on conflicts.
	MaxRetries int
	// OwnerID identifies this node to the storage node; a random one when zero. A node that
	// restarts with the same id continues its batch sequence. Two live nodes must not share
	// one: the second is refused with ErrOwnerInUse (see OwnerInUseWait).
	OwnerID uint64

	// FullPageIO makes the node fetch and ship whole pages instead of sparse rows: an
	// ablation that shows what sparse IO saves (crudbench --full-page-io). Not for production.
	FullPageIO bool

	// Secret is the storage node's shared secret (remote store), as configured there: hex or
	// base64 of at least 16 random bytes (sgio.ParseSecret; anything else fails Open with
	// sgio.ErrWeakSecret), or empty for a loopback node without one.
	Secret []byte
	// DialTimeout and RequestTimeout bound the remote store's dial and each request. A call
	// waits for a reconnect for up to RequestTimeout into an outage; past it, calls fail at
	// once with ErrUnavailable until the storage node is back.
	DialTimeout, RequestTimeout time.Duration
	// OwnerInUseWait is how long Open keeps dialing while the storage node answers
	// ErrOwnerInUse (another live incarnation holds OwnerID: it must close, or be silent for
	// a lease). Zero (the default): the storage node's own lease (from its hello reply) plus
	// OwnerInUseMargin, so a node restarted right after a crash opens once the dead one's
	// lease has run out, however long the storage node's lease is. (Reconnects after Open
	// keep dialing for as long as the DB is open.)
	OwnerInUseWait time.Duration

	// SyncMode is the embedded store's WAL sync mode: "always" (default) or "none".
	SyncMode string
	// StoreCacheBytes is the embedded store's disk page cache.
	StoreCacheBytes int64

	// Logger receives lease and failure events; slog.Default() when nil.
	Logger *slog.Logger

	// clock is the lease clock (monotonic); tests inject one.
	clock leaseClock
	// renewTick, when set (tests), replaces the ticker of the renewal loop (renewLeases);
	// renewed, when set, is called at the end of each re-registration of a cluster
	// table's grant (renewGrant) with its error.
	renewTick <-chan time.Time
	renewed   func(table string, err error)
	// lockedTimer, when set (tests), makes the timers of a cluster table's registration
	// waiting out the store's transactions in doubt (registerClusterGrant): a channel that
	// fires once after d, and a stop. time.NewTimer's when nil.
	lockedTimer func(d time.Duration) (<-chan time.Time, func() bool)
	// reconnectTimer, when set (tests), makes the remote store's reconnect timers (its
	// backoff between redials, and RequestTimeout into an outage, when it becomes
	// unavailable), with lockedTimer's contract.
	reconnectTimer func(d time.Duration) (<-chan time.Time, func() bool)
}

func (o Options) withDefaults() Options {
	if o.CacheBytes == 0 {
		o.CacheBytes = DefaultCacheBytes
	}
	o.CacheBytes = max(o.CacheBytes, MinCacheBytes)
	if o.PinBytes == 0 {
		o.PinBytes = o.CacheBytes / 2
	}
	if o.CacheWait == 0 {
		o.CacheWait = DefaultCacheWait
	}
	if o.InflightBytes <= 0 {
		o.InflightBytes = DefaultInflightBytes
	}
	if o.FlushInterval == 0 {
		o.FlushInterval = DefaultFlushInterval
	}
	if o.MaxRetries == 0 {
		o.MaxRetries = DefaultMaxRetries
	}
	if o.RequestTimeout == 0 {
		o.RequestTimeout = DefaultRequestTimeout
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = DefaultDialTimeout
	}
	if o.SyncMode == "" {
		o.SyncMode = "always"
	}
	if o.StoreCacheBytes == 0 {
		o.StoreCacheBytes = DefaultStoreCacheBytes
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.clock == nil {
		o.clock = monoClock{origin: time.Now()}
	}
	return o
}

// Grants hands out the etcd grants of the partitions of cluster-managed tables. Package
// cluster implements it (cluster.TxGrants, on a Session). Any goroutine may call it.
type Grants interface {
	// Grant acquires the grant of partition part of the partitioned table table: its epoch
	// (the etcd revision that created the owner key), which the storage node verifies when
	// this node registers it; check, which returns nil while this node may serve the
	// partition (cluster.Ownership.Check: lock-free, allocation-free on success; it takes
	// the place of the storage node's lease); and release, which gives the grant up (the next
	// Grant is a new one, with a higher epoch). The error of a partition another node holds
	// matches cluster.ErrOwned.
	Grant(ctx context.Context, table string, part uint32) (epoch uint64, check func() error, release func(context.Context) error, err error)
}
