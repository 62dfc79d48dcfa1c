package txnode

import "sync/atomic"

// hitShards spreads the cache-hit counter over padded cells, so 128 goroutines reading on
// two cores do not all increment one cache line.
const hitShards = 16

type paddedCounter struct {
	n atomic.Uint64
	_ [56]byte
}

type dbCounters struct {
	hits        [hitShards]paddedCounter
	commits     atomic.Uint64
	aborts      atomic.Uint64
	retries     atomic.Uint64
	batches     atomic.Uint64
	batchTx     atomic.Uint64
	idGrants    atomic.Uint64
	rowsFetched atomic.Uint64
}

func (c *dbCounters) hit(id uint64) { c.hits[(id>>6)%hitShards].n.Add(1) }

// Stats are counters of a DB since Open.
type Stats struct {
	// RowHits counts single-row reads served by the lock-free fast path; PageMisses counts
	// fetches from the store; RowsFetched the rows they brought.
	RowHits, PageMisses, RowsFetched uint64
	// Evictions counts frames evicted; CacheBytes is the cache's accounted memory now.
	Evictions  uint64
	CacheBytes int64
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
}

// Stats returns the DB's counters.
func (db *DB) Stats() Stats {
	var hits uint64
	for i := range db.stats.hits {
		hits += db.stats.hits[i].n.Load()
	}
	s := Stats{
		RowHits:        hits,
		PageMisses:     db.cache.misses.Load(),
		RowsFetched:    db.stats.rowsFetched.Load(),
		Evictions:      db.cache.evictions.Load(),
		CacheBytes:     db.cache.bytesUsed(),
		Commits:        db.stats.commits.Load(),
		Aborts:         db.stats.aborts.Load(),
		Retries:        db.stats.retries.Load(),
		Batches:        db.stats.batches.Load(),
		IDGrants:       db.stats.idGrants.Load(),
		CommitVersion:  db.commitVer.Load(),
		DurableVersion: db.durableVer.Load(),
		DirtyRows:      db.pipe.dirtyRows.Load(),
	}
	if s.Batches > 0 {
		s.TxPerBatch = float64(db.stats.batchTx.Load()) / float64(s.Batches)
	}
	return s
}
