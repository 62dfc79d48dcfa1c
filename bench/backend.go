package bench

import (
	"context"
	"errors"
	"time"
)

// Backend is one store under test, opened for one cache size. Every method but Load and Close
// may be called from many goroutines at once; each call is one transaction of its own.
//
// Row ids are the backend's: Load returns the first id of the Records rows it loaded, which
// are the ids first, first+1, ... first+Records-1; Insert returns the id it chose.
type Backend interface {
	// Load inserts spec.Records rows (rows made by spec.Row) and returns the first id. It
	// calls spec.Progress with the rows loaded since the last call, from any goroutine.
	Load(ctx context.Context, spec LoadSpec) (first uint64, err error)
	// Insert adds row under a new id and returns the id.
	Insert(ctx context.Context, row []byte) (uint64, error)
	// Get copies row id into dst (the row size).
	Get(ctx context.Context, id uint64, dst []byte) error
	// Update reads row id, calls fn on a copy and writes the copy back (read-modify-write).
	// fn may run more than once.
	Update(ctx context.Context, id uint64, fn func(row []byte) error) error
	// Delete deletes row id, which exists.
	Delete(ctx context.Context, id uint64) error
	// Stats returns the backend's counters since it was opened.
	Stats() Stats
	// Close releases everything the backend holds (temp directories included).
	Close() error
}

// AsyncBackend is a Backend that lets one goroutine keep many transactions in flight
// (--async). Each worker gets its own session.
type AsyncBackend interface {
	Backend
	// NewSession returns a session for one goroutine.
	NewSession() AsyncSession
}

// AsyncSession starts transactions without waiting for them to be durable. It is used by one
// goroutine. The dst of Get is filled before Get returns; the ops of a session resolve in the
// order they were started.
type AsyncSession interface {
	Insert(ctx context.Context, row []byte) (uint64, Pending)
	Get(ctx context.Context, id uint64, dst []byte) Pending
	Update(ctx context.Context, id uint64, fn func(row []byte) error) Pending
	Delete(ctx context.Context, id uint64) Pending
}

// Pending is a started transaction; Wait returns once it is durable, or its error.
type Pending interface {
	Wait(ctx context.Context) error
}

// donePending is a Pending that already failed (or succeeded, with a nil error).
type donePending struct{ err error }

func (p donePending) Wait(context.Context) error { return p.err }

// LoadSpec describes the initial table.
type LoadSpec struct {
	Records  int
	RowBytes int
	// Workers is how many goroutines may load at once.
	Workers int
	// Row fills row with the content of the i-th loaded row (i from 0), given its id.
	Row func(row []byte, id uint64)
	// Progress reports loaded rows; it may be called from any goroutine.
	Progress func(rows int)
}

// Stats are a backend's counters. The bench reports the difference across a workload.
type Stats struct {
	// NetBytes counts bytes on the TCP connections between this process and the store, both
	// directions (0 for an in-process store).
	NetBytes uint64
	// WALBytes counts bytes appended to the store's write-ahead log (or its equivalent: the
	// AOF for Redis, the data file for bbolt).
	WALBytes uint64
	// WALSyncs counts the log's fsyncs (0 when the backend cannot count them).
	WALSyncs uint64
	// HasCache says the backend has a cache whose hit ratio means something; then
	// CacheMisses counts misses and CacheLookups lookups, or 0 when the backend cannot count
	// them: the bench then uses the number of rows the workload read.
	HasCache                  bool
	CacheLookups, CacheMisses uint64
	// ServerCPU is the CPU time used by a store process other than this one (a spawned
	// storage node, redis-server), 0 when there is none or it cannot be read. The bench adds
	// this process's own CPU time.
	ServerCPU time.Duration
}

// Factory opens a backend: one engine of the comparison.
type Factory struct {
	// Name is the engine's name in reports (engine=Name).
	Name string
	// CacheSensitive says OpenConfig.CacheBytes changes the engine: it runs once per cache
	// size. Otherwise it runs once, reported with cache_bytes 0.
	CacheSensitive bool
	// Note is printed under the report (what the engine's ops really are).
	Note string
	// Open opens the engine for one cache size.
	Open func(ctx context.Context, cfg OpenConfig) (Backend, error)
}

// OpenConfig is what a Factory gets from the command line.
type OpenConfig struct {
	CacheBytes int64
	RowBytes   int
	Workers    int
	// Sync is the WAL sync mode: "always" or "none".
	Sync string
	// Durability is Weft's: "durable" or "writeback".
	Durability string
	// Logf prints a note (nil-safe through Config.logf).
	Logf func(format string, args ...any)
}

// ErrSkip is returned by Factory.Open when the engine cannot run here (a missing binary);
// the run goes on without it.
var ErrSkip = errors.New("bench: engine skipped")
