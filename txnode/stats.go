package txnode

import (
	"sync/atomic"
	"time"
	_ "unsafe" // go:linkname

	"github.com/weftdb/weft/internal/latency"
)

// hitShards is how many padded cells a cache-hit counter has (the DB's and each table's): one per P (runtime.procPin's
// id, modulo hitShards), so a hit increments a cache line only its own core writes. Sharded
// by page instead, two cores incremented the same 16 lines at random and a hit moved one of
// them between cores about every other time.
const hitShards = 64

// procPin and procUnpin are the runtime's (sync.Pool's): procPin disables preemption and
// returns the current P's id.
//
//go:linkname procPin runtime.procPin
func procPin() int

//go:linkname procUnpin runtime.procUnpin
func procUnpin()

type paddedCounter struct {
	n atomic.Uint64
	_ [56]byte
}

type dbCounters struct {
	// hits holds the lock-free hits of the tables dropped (retire); the live tables count
	// their own (tableCounters), one increment per hit.
	hits        [hitShards]paddedCounter
	commits     atomic.Uint64
	aborts      atomic.Uint64
	retries     atomic.Uint64
	batches     atomic.Uint64
	batchTx     atomic.Uint64
	idGrants    atomic.Uint64
	rowsFetched atomic.Uint64
	renewals    atomic.Uint64 // lease renewals that succeeded
	renewFails  atomic.Uint64 // lease renewals that failed (renewLease)
	// commitLat records each write transaction's commit, from its validation to its
	// durable (Durable) or installed and acknowledged-in-order (WriteBack) answer.
	commitLat latency.Histogram
}

// retire adds the lock-free hits of table t, being dropped, to the DB's (hits[0]): the
// DB's RowHits are the sum of its tables' and of those dropped. Caller holds db.mu (as
// Stats, which sums them). A hit counted on t after its drop is lost (a Get that raced the
// drop).
func (c *dbCounters) retire(t *tableState) {
	c.hits[0].n.Add(t.cnt.fastHits())
}

// Stats are counters of a DB since Open.
type Stats struct {
	// RowHits counts single-row reads served by the lock-free fast path; PageMisses counts
	// fetches from the store; RowsFetched the rows they brought. Table.Stats has them per
	// table (a partition's: its hit rate).
	RowHits, PageMisses, RowsFetched uint64
	// Evictions counts frames evicted; CacheBytes is the cache's accounted memory now.
	Evictions  uint64
	CacheBytes int64
	// PinnedBytes is what the table pins (Table.Pin) hold now, of PinBytes (Options.PinBytes).
	PinnedBytes, PinBytes int64
	// Commits, Aborts and Retries count transactions committed, failed validation, and
	// retried by Update.
	Commits, Aborts, Retries uint64
	// Batches counts commit batches sent; TxPerBatch is Commits per batch (group commit).
	Batches    uint64
	TxPerBatch float64
	// IDGrants counts id grants asked of the store.
	IDGrants uint64
	// CommitVersion is the commit counter; DurableVersion the highest version acknowledged;
	// their difference is the flush lag in commits.
	CommitVersion, DurableVersion uint64
	// DirtyRows is the number of WriteBack rows not yet flushed.
	DirtyRows int64
	// Renewals and RenewalFailures count the lease renewals of a remote store's tables that
	// succeeded and that failed (each failure is logged too); three quarters of a lease
	// without a success and the table stops being served. They count the periodic
	// re-registrations of cluster-managed tables' etcd grants too (a failure there stops
	// the table only when the store fenced the grant or has no such table).
	Renewals, RenewalFailures uint64
	// CommitP50, CommitP99 and CommitP999 are percentiles of the commit latency of the write
	// transactions since Open (from the commit's validation to its answer: in Durable mode
	// the storage node's acknowledgement), each the upper bound of a power-of-two
	// microsecond bucket (an estimate within a factor of two, as the storage node's
	// weft_commit_latency_seconds histogram); 0 before the first.
	CommitP50, CommitP99, CommitP999 time.Duration
}

// Stats returns the DB's counters.
func (db *DB) Stats() Stats {
	var hits uint64
	db.mu.Lock()
	for i := range db.stats.hits {
		hits += db.stats.hits[i].n.Load()
	}
	for _, t := range db.byID {
		hits += t.cnt.fastHits()
	}
	db.mu.Unlock()
	s := Stats{
		RowHits:         hits,
		PageMisses:      db.cache.misses.Load(),
		RowsFetched:     db.stats.rowsFetched.Load(),
		Evictions:       db.cache.evictions.Load(),
		CacheBytes:      db.cache.bytesUsed(),
		PinnedBytes:     db.cache.pinnedBytes(),
		PinBytes:        db.opts.PinBytes,
		Commits:         db.stats.commits.Load(),
		Aborts:          db.stats.aborts.Load(),
		Retries:         db.stats.retries.Load(),
		Batches:         db.stats.batches.Load(),
		IDGrants:        db.stats.idGrants.Load(),
		CommitVersion:   db.commitVer.Load(),
		DurableVersion:  db.durableVer.Load(),
		Renewals:        db.stats.renewals.Load(),
		RenewalFailures: db.stats.renewFails.Load(),
		DirtyRows:       db.pipe.dirtyRows.Load(),
	}
	lat := db.stats.commitLat.Snapshot()
	s.CommitP50, s.CommitP99, s.CommitP999 = lat.Quantile(0.5), lat.Quantile(0.99), lat.Quantile(0.999)
	if s.Batches > 0 {
		s.TxPerBatch = float64(db.stats.batchTx.Load()) / float64(s.Batches)
	}
	return s
}
