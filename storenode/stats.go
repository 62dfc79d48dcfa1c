package storenode

import (
	"sync/atomic"
	"time"
)

// engineCounters are updated without the engine lock.
type engineCounters struct {
	commits     atomic.Uint64
	retried     atomic.Uint64
	rowsWritten atomic.Uint64
	walBytes    atomic.Uint64
	diskReads   atomic.Uint64
	diskWrites  atomic.Uint64
	checkpoints atomic.Uint64
	ckptPages   atomic.Uint64
	ckptLastNs  atomic.Int64
	stallMaxNs  atomic.Int64

	ownersExpired atomic.Uint64
}

func (c *engineCounters) noteCheckpoint(d time.Duration, pages int) {
	c.checkpoints.Add(1)
	c.ckptPages.Add(uint64(pages))
	c.ckptLastNs.Store(int64(d))
}

func (c *engineCounters) noteStall(d time.Duration) {
	for {
		old := c.stallMaxNs.Load()
		if int64(d) <= old || c.stallMaxNs.CompareAndSwap(old, int64(d)) {
			return
		}
	}
}

// Stats are counters of an engine since Open.
type Stats struct {
	// Commits is the number of batches applied; RetriedBatches those acknowledged again
	// without being applied (same owner and seq).
	Commits, RetriedBatches uint64
	// RowsWritten counts rows written or deleted by commits.
	RowsWritten uint64
	// CacheHits and CacheMisses count page reads served from the disk page cache and those
	// that needed the disk (like PostgreSQL's blks_hit and blks_read).
	CacheHits, CacheMisses uint64
	// CachePages, DirtyPages and CacheBytes describe the disk page cache now.
	CachePages, DirtyPages int
	CacheBytes             int64
	// DiskReads and DiskWrites count disk pages read and written.
	DiskReads, DiskWrites uint64
	// WALBytes, WALRecords and WALSyncs come from the WAL; rows per sync is RowsWritten/WALSyncs.
	WALBytes, WALRecords, WALSyncs uint64
	// Checkpoints counts published checkpoints; CheckpointPages the pages they wrote;
	// LastCheckpoint how long the last one took; CheckpointLSN its LSN.
	Checkpoints, CheckpointPages uint64
	LastCheckpoint               time.Duration
	CheckpointLSN                uint64
	// Backups is the number of backups holding a snapshot now; BackupHeldPages the disk
	// pages kept from reuse for them (Engine.BackupHold). While one runs, checkpoints keep
	// the WAL from its snapshot on, so wal/ and the data files grow.
	Backups, BackupHeldPages int
	// LongestStall is the longest time a commit waited for the cache to make room.
	LongestStall time.Duration
	// LastLSN is the last LSN handed to the WAL.
	LastLSN uint64
	// Owners is the size of the owners table (owners with a dedup window); OwnersExpired
	// counts the entries expired since Open.
	Owners        int
	OwnersExpired uint64
}

// Stats returns the engine's counters.
func (e *Engine) Stats() Stats {
	e.mu.Lock()
	s := Stats{
		CacheHits:       e.cache.hits,
		CacheMisses:     e.cache.misses,
		CachePages:      len(e.cache.index),
		DirtyPages:      e.cache.dirtyFrames,
		CacheBytes:      e.cache.usedBytes,
		CheckpointLSN:   e.ckptLSN,
		LastLSN:         e.lastLSN,
		Owners:          len(e.owners),
		Backups:         len(e.backups),
		BackupHeldPages: len(e.heldPages),
	}
	e.mu.Unlock()
	c := &e.stats
	s.Commits, s.RetriedBatches, s.RowsWritten = c.commits.Load(), c.retried.Load(), c.rowsWritten.Load()
	s.DiskReads, s.DiskWrites = c.diskReads.Load(), c.diskWrites.Load()
	s.Checkpoints, s.CheckpointPages = c.checkpoints.Load(), c.ckptPages.Load()
	s.LastCheckpoint = time.Duration(c.ckptLastNs.Load())
	s.LongestStall = time.Duration(c.stallMaxNs.Load())
	s.OwnersExpired = c.ownersExpired.Load()
	if e.log != nil {
		ws := e.log.Stats()
		s.WALBytes, s.WALRecords, s.WALSyncs = ws.Bytes, ws.Records, ws.Syncs
	}
	return s
}
