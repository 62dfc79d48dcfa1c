package txnode

import (
	"log/slog"
	"time"
)

// Durability says when a commit returns.
type Durability uint8

const (
	// Durable (the default): a commit returns only after the storage node has the batch in its
	// WAL, synced per the node's sync mode. A transaction that read rows of a commit not yet
	// durable also waits for it, so nothing a caller saw can be lost by a crash.
	Durable Durability = iota
	// WriteBack: a commit returns once it is installed in the cache. Dirty rows are flushed in
	// epochs, each one atomic commit batch, every FlushInterval and when the cache needs room;
	// repeated writes to a row and rows of one page coalesce. A crash of this process loses
	// at most the unflushed epochs, never part of one.
	WriteBack
)

// Defaults of Options.
const (
	DefaultCacheBytes      = 64 << 20
	DefaultFlushInterval   = 20 * time.Millisecond
	DefaultMaxRetries      = 64
	DefaultCacheWait       = 2 * time.Second
	DefaultRequestTimeout  = 10 * time.Second
	DefaultDialTimeout     = 5 * time.Second
	DefaultStoreCacheBytes = 256 << 20
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
	// Store is a Store to use as it is (tests, custom deployments); Close closes it.
	Store Store

	// CacheBytes is the hard budget of the logical page cache. It counts the frames (64 rows
	// and 64 version words each, rounded up to the allocator's size class), the per-frame
	// metadata (allocated 64 frames at a time, 4 KiB), the page table and a fixed part (the
	// chunk directory, 8 bytes per 64 frames the budget could hold, and 4 KiB of row-wait
	// shards). Not counted: a few hundred bytes of structs and 4 bytes per frame id in
	// free lists. At MinCacheBytes it holds 11 pages of 64-byte rows.
	CacheBytes int64
	// CacheWait bounds how long a request waits for a frame when every frame is pinned,
	// dirty or in flight, before it fails with ErrCacheFull (a context that ends sooner ends
	// the wait sooner). It also bounds how long DB.Update keeps retrying a transaction that
	// found the cache full while it held pages (it parks for the cache turn meanwhile).
	CacheWait time.Duration
	// Durability is Durable (default) or WriteBack.
	Durability Durability
	// FlushInterval is WriteBack's flush period.
	FlushInterval time.Duration
	// MaxRetries bounds how often DB.Update runs its closure on conflicts.
	MaxRetries int
	// OwnerID identifies this node to the storage node; a random one when zero. A node that
	// restarts with the same id continues its batch sequence.
	OwnerID uint64

	// FullPageIO makes the node fetch and ship whole pages instead of sparse rows: an
	// ablation that shows what sparse IO saves (crudbench --full-page-io). Not for production.
	FullPageIO bool

	// Secret is the storage node's shared secret (remote store).
	Secret []byte
	// DialTimeout and RequestTimeout bound the remote store's dial and each request.
	DialTimeout, RequestTimeout time.Duration

	// SyncMode is the embedded store's WAL sync mode: "always" (default) or "none".
	SyncMode string
	// StoreCacheBytes is the embedded store's disk page cache.
	StoreCacheBytes int64

	// Logger receives lease and failure events; slog.Default() when nil.
	Logger *slog.Logger
}

func (o Options) withDefaults() Options {
	if o.CacheBytes == 0 {
		o.CacheBytes = DefaultCacheBytes
	}
	o.CacheBytes = max(o.CacheBytes, MinCacheBytes)
	if o.CacheWait == 0 {
		o.CacheWait = DefaultCacheWait
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
	return o
}
