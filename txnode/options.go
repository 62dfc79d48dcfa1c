package txnode

import (
	"log/slog"
	"time"

	"github.com/weftdb/weft/txnode/internal/coordbridge"
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

// DefaultMaxRetries is Options.MaxRetries' default: how often DB.Update runs its closure on
// conflicts. A retry loop of the caller's own over Begin and Commit (package hashindex's)
// bounds its attempts by it.
const DefaultMaxRetries = 64

// Defaults of the other Options fields (their docs give the values).
const (
	defaultCacheBytes     = 64 << 20
	defaultFlushInterval  = 20 * time.Millisecond
	defaultCacheWait      = 2 * time.Second
	defaultInflightBytes  = 8 << 20
	defaultRequestTimeout = 10 * time.Second
	defaultDialTimeout    = 5 * time.Second
	// ownerInUseMargin is added to a lease for the ErrOwnerInUse retries: the storage node
	// measures the holder's silence on its own clock, from its last renewal.
	ownerInUseMargin       = 2 * time.Second
	defaultStoreCacheBytes = 256 << 20
	// minCacheBytes is the smallest logical page cache.
	minCacheBytes = 64 << 10
)

// Options configure Open. Zero fields take their defaults. The fields come in groups, each for
// a deployment:
//   - where the rows are: exactly one of Dir (embedded), StoreAddr (a storage node over TCP)
//     and Store;
//   - every deployment: Durability, FlushInterval, CacheBytes, PinBytes, CacheWait,
//     InflightBytes, MaxRetries, OwnerID, Logger;
//   - the embedded store only: SyncMode, StoreCacheBytes;
//   - a storage node over TCP only: Secret, DialTimeout, RequestTimeout, OwnerInUseWait;
//   - benchmarks only: FullPageIO.
//
// A cluster's transaction nodes, which own partitions under etcd grants, are opened by its
// coordinator (package cluster/node, through txncoord.Open), not by the game.
type Options struct {
	// Where the rows are: exactly one of Dir, StoreAddr and Store.

	// Dir is the directory of the embedded store (an in-process storage engine, no TCP):
	// the default deployment. Exactly one of Dir, StoreAddr and Store must be set.
	Dir string
	// StoreAddr is the address of a storage node (host:port) to use over TCP.
	StoreAddr string
	// Store is a store to use as it is (tests, custom deployments, store.OpenEmbedded with
	// storenode.Options of your own); Close closes it. Most programs set Dir or StoreAddr.
	Store store.Store

	// Every deployment.

	// Durability is Durable (default) or WriteBack: see Durability for what a crash or a
	// missing Close loses in each.
	Durability Durability
	// FlushInterval is WriteBack's flush period. 0: 20 ms.
	FlushInterval time.Duration
	// CacheBytes is the hard budget of the logical page cache, in bytes: frames, their
	// metadata, the page table and a fixed part (docs/txnode-concurrency.md, "The cache
	// budget"). 0: 64 MiB; below 64 KiB (the least, which holds 11 pages of 64-byte
	// rows): 64 KiB.
	CacheBytes int64
	// PinBytes bounds what the table pins (Table.Pin) may hold of the cache, in bytes, at
	// frameCost a page; DB.Pin's page ranges do not count. 0: half of CacheBytes; negative: no
	// table may be pinned; above three quarters of CacheBytes Open fails (docs/txnode.md,
	// "Options: where each rule is explained").
	PinBytes int64
	// CacheWait bounds how long a request waits for a frame when every frame is pinned or
	// dirty, then fails with ErrCacheFull (its context may end the wait sooner), and how long
	// DB.Update retries a transaction that found the cache full while it held pages.
	// 0: 2 s.
	CacheWait time.Duration
	// InflightBytes bounds what the commit batches not yet acknowledged hold, in bytes: their
	// rows plus about 100 bytes a page segment. A commit that would pass it waits (its context
	// ends the wait, nothing applied); one larger is admitted alone. 0 or negative:
	// 8 MiB. docs/txnode-concurrency.md, "Rows in flight and eviction".
	InflightBytes int64
	// MaxRetries bounds how often DB.Update runs its closure on conflicts.
	// 0: DefaultMaxRetries (64).
	MaxRetries int
	// OwnerID identifies this node to the storage node; a random one when zero. A node that
	// restarts with the same id continues its batch sequence. Two live nodes must not share
	// one: the second is refused with ErrOwnerInUse (see OwnerInUseWait).
	OwnerID uint64
	// Logger receives lease and failure events; slog.Default() when nil.
	Logger *slog.Logger

	// The embedded store (Dir) only.

	// SyncMode is the embedded store's WAL sync mode: "always" (default) or "none".
	SyncMode string
	// StoreCacheBytes is the embedded store's disk page cache, in bytes.
	// 0: 256 MiB.
	StoreCacheBytes int64

	// A storage node over TCP (StoreAddr) only.

	// Secret is the storage node's shared secret (remote store), as configured there: hex or
	// base64 of at least 16 random bytes (sgio.ParseSecret; anything else fails Open with
	// sgio.ErrWeakSecret), or empty for a loopback node without one.
	Secret []byte
	// DialTimeout and RequestTimeout bound the remote store's dial and each request. A call
	// waits for a reconnect for up to RequestTimeout into an outage; past it, calls fail at
	// once with ErrUnavailable until the storage node is back. 0: 5 s and 10 s.
	DialTimeout, RequestTimeout time.Duration
	// OwnerInUseWait is how long Open keeps dialing while the storage node answers
	// ErrOwnerInUse (another live incarnation holds OwnerID). 0: the storage node's lease
	// (from its hello reply) plus 2 s. Reconnects after Open keep dialing
	// while the DB is open. docs/operations.md, "Restarting or replacing a transaction node".
	OwnerInUseWait time.Duration

	// Benchmarks only.

	// FullPageIO makes the node fetch and ship whole pages instead of sparse rows: an
	// ablation that shows what sparse IO saves (crudbench --full-page-io). Not for production.
	FullPageIO bool

	// grants hands out the etcd grants of cluster-managed tables (txncoord.Open, whose doc
	// has the rules); nil: no cluster, and a cluster-managed table fails to open.
	grants coordbridge.Grants
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

// cacheBytes is the cache budget of Options.CacheBytes n: its default for 0, at least
// minCacheBytes.
func cacheBytes(n int64) int64 {
	if n == 0 {
		n = defaultCacheBytes
	}
	return max(n, minCacheBytes)
}

func (o Options) withDefaults() Options {
	o.CacheBytes = cacheBytes(o.CacheBytes)
	if o.PinBytes == 0 {
		o.PinBytes = o.CacheBytes / 2
	}
	if o.CacheWait == 0 {
		o.CacheWait = defaultCacheWait
	}
	if o.InflightBytes <= 0 {
		o.InflightBytes = defaultInflightBytes
	}
	if o.FlushInterval == 0 {
		o.FlushInterval = defaultFlushInterval
	}
	if o.MaxRetries == 0 {
		o.MaxRetries = DefaultMaxRetries
	}
	if o.RequestTimeout == 0 {
		o.RequestTimeout = defaultRequestTimeout
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = defaultDialTimeout
	}
	if o.SyncMode == "" {
		o.SyncMode = "always"
	}
	if o.StoreCacheBytes == 0 {
		o.StoreCacheBytes = defaultStoreCacheBytes
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.clock == nil {
		o.clock = monoClock{origin: time.Now()}
	}
	return o
}
