package storenode

import (
	"math"
	"math/bits"
	"sync/atomic"
	"time"

	"github.com/weftdb/weft/base"
)

// engineCounters are updated without the engine lock.
type engineCounters struct {
	commits                          atomic.Uint64
	retried                          atomic.Uint64
	rowsWritten                      atomic.Uint64
	walBytes                         atomic.Uint64
	diskReads                        atomic.Uint64
	diskWrites                       atomic.Uint64
	mapLogBytes                      atomic.Uint64 // bytes checkpoints wrote to the map log (maplog.go)
	mapLogAppends, mapLogCompactions atomic.Uint64
	checkpoints                      atomic.Uint64
	ckptPages                        atomic.Uint64
	ckptLastNs                       atomic.Int64
	stallMaxNs                       atomic.Int64

	ownersExpired atomic.Uint64

	// etcd grants of cluster-managed tables (cluster.go)
	grantsRegistered, grantsRefused, grantsUnverified atomic.Uint64
	// Two-phase commit (txn.go).
	txnCommits, txnAborts          atomic.Uint64 // prepared batches applied, dropped
	txnResolved, txnResolvedAborts atomic.Uint64 // resolved by asking the primary; aborts recorded for a resolver
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
	// CachePages, DirtyPages and CacheBytes describe the disk page cache now; CacheBytes
	// counts the frames (rows and metadata) and the page index's nodes, all the budget holds.
	CachePages, DirtyPages int
	CacheBytes             int64
	// DiskReads and DiskWrites count disk pages read and written.
	DiskReads, DiskWrites uint64
	// WALBytes, WALRecords and WALSyncs come from the WAL; rows per sync is RowsWritten/WALSyncs
	// (the rows_per_sync stat).
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
	// GrantsRegistered counts the etcd grants of cluster-managed tables accepted (logged,
	// renewals not counted); GrantsRefused those refused (below the floor, or not what etcd
	// holds); GrantsUnverified those etcd could not confirm in time.
	GrantsRegistered, GrantsRefused, GrantsUnverified uint64
	// TxnPrepared is the two-phase commit parts kept (prepared, or applied and not yet
	// reported); TxnDecisions the decisions kept as a primary. TxnCommits and TxnAborts
	// count prepared batches applied and dropped, TxnResolved those resolved by asking the
	// primary, TxnResolverAborts the aborts recorded as primary for a resolver.
	TxnPrepared, TxnDecisions int
	// TxnInDoubt is the parts prepared for at least Options.TxnInDoubtAfter (TxnsInDoubt).
	TxnInDoubt                                            int
	TxnCommits, TxnAborts, TxnResolved, TxnResolverAborts uint64
}

// Stats returns the engine's counters.
func (e *Engine) Stats() Stats {
	e.mu.Lock()
	s := Stats{
		CacheHits:       e.cache.hits,
		CacheMisses:     e.cache.misses,
		CachePages:      e.cache.index.n,
		DirtyPages:      e.cache.dirtyFrames,
		CacheBytes:      e.cache.usedBytes + e.cache.index.bytes,
		CheckpointLSN:   e.ckptLSN,
		LastLSN:         e.lastLSN,
		Owners:          len(e.owners),
		Backups:         len(e.backups),
		BackupHeldPages: len(e.heldPages),
		TxnPrepared:     len(e.txnParts),
		TxnDecisions:    len(e.txnDecisions),
		TxnInDoubt:      e.txnInDoubtCount(),
	}
	e.mu.Unlock()
	c := &e.stats
	s.Commits, s.RetriedBatches, s.RowsWritten = c.commits.Load(), c.retried.Load(), c.rowsWritten.Load()
	s.DiskReads, s.DiskWrites = c.diskReads.Load(), c.diskWrites.Load()
	s.Checkpoints, s.CheckpointPages = c.checkpoints.Load(), c.ckptPages.Load()
	s.LastCheckpoint = time.Duration(c.ckptLastNs.Load())
	s.LongestStall = time.Duration(c.stallMaxNs.Load())
	s.OwnersExpired = c.ownersExpired.Load()
	s.GrantsRegistered, s.GrantsRefused, s.GrantsUnverified = c.grantsRegistered.Load(), c.grantsRefused.Load(), c.grantsUnverified.Load()
	s.TxnCommits, s.TxnAborts = c.txnCommits.Load(), c.txnAborts.Load()
	s.TxnResolved, s.TxnResolverAborts = c.txnResolved.Load(), c.txnResolvedAborts.Load()
	if e.log != nil {
		ws := e.log.Stats()
		s.WALBytes, s.WALRecords, s.WALSyncs = ws.Bytes, ws.Records, ws.Syncs
	}
	return s
}

// One definition of every stat. A StatDesc names a stat once, says what it is and how to read
// it from its source (Stats here, a server's counters in storenode/server), and every consumer
// derives its view from the table: the wire's StatsReply (WireName, the raw value), the
// storage node's Prometheus metrics (MetricName, MetricValue) and `weft stats`. A test ties
// them: every field of Stats is read by some descriptor, and every descriptor appears on the
// wire and in /metrics with the same value (cmd/storenode's stats test).

// StatKind says how a stat's value moves.
type StatKind uint8

// Stat kinds.
const (
	// StatCounter only grows, from zero at Open (or at a server's start).
	StatCounter StatKind = iota + 1
	// StatGauge is a level now: it goes up and down.
	StatGauge
)

// StatUnit says what a stat's value counts: its value is always a uint64, and the unit says
// how each consumer names and scales it.
type StatUnit uint8

// Stat units.
const (
	// UnitCount is a number of things (rows, bytes, pages) or an LSN: shown as is.
	UnitCount StatUnit = iota
	// UnitNanos is a duration in nanoseconds: "_ns" on the wire, "_seconds" in Prometheus.
	UnitNanos
	// UnitMilli is a ratio in thousandths: "_milli" on the wire, the ratio in Prometheus.
	UnitMilli
)

// StatDesc describes one stat of a T (Stats, or a server's counters). Name is the stat's
// base name ([a-z0-9_], the unit's suffix not included); Value reads it from a snapshot.
type StatDesc[T any] struct {
	Name  string
	Help  string
	Kind  StatKind
	Unit  StatUnit
	Value func(*T) uint64
}

// WireName is the stat's name in a StatsReply: Name with its unit's suffix ("_ns", "_milli").
func (d StatDesc[T]) WireName() string {
	switch d.Unit {
	case UnitNanos:
		return d.Name + "_ns"
	case UnitMilli:
		return d.Name + "_milli"
	}
	return d.Name
}

// MetricName is the stat's Prometheus name without the exporter's prefix: Name, "_seconds"
// for a duration, "_total" for a counter (Prometheus's naming conventions).
func (d StatDesc[T]) MetricName() string {
	n := d.Name
	if d.Unit == UnitNanos {
		n += "_seconds"
	}
	if d.Kind == StatCounter {
		n += "_total"
	}
	return n
}

// MetricValue is v, a value of the stat, in Prometheus's base unit: seconds for a duration,
// the ratio for thousandths.
func (d StatDesc[T]) MetricValue(v uint64) float64 {
	switch d.Unit {
	case UnitNanos:
		return float64(v) / 1e9
	case UnitMilli:
		return float64(v) / 1e3
	}
	return float64(v)
}

// AppendStats appends the wire stats of s, one per descriptor in table order, to dst.
func AppendStats[T any](dst []base.Stat, descs []StatDesc[T], s *T) []base.Stat {
	for _, d := range descs {
		dst = append(dst, base.Stat{Name: d.WireName(), Value: d.Value(s)})
	}
	return dst
}

// StatDescs returns the engine's stats, in the order they are listed and sent. The slice is
// shared: callers must not modify it.
func StatDescs() []StatDesc[Stats] { return engineStatDescs }

// statValue is v as a stat's value: every row of the table reads its field through it, a
// negative gauge (never expected) as 0.
func statValue[N int | int64 | uint64 | time.Duration](v N) uint64 { return uint64(max(v, 0)) }

var engineStatDescs = []StatDesc[Stats]{
	// Commits and the WAL.
	{Name: "commits", Help: "Commit batches applied.", Kind: StatCounter, Unit: UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.Commits) }},
	{Name: "retried_batches", Help: "Commit batches acknowledged again without being applied (same owner and seq).", Kind: StatCounter, Unit: UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.RetriedBatches) }},
	{Name: "rows_written", Help: "Rows written or deleted by commits.", Kind: StatCounter, Unit: UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.RowsWritten) }},
	{Name: "wal_bytes", Help: "Bytes appended to the WAL.", Kind: StatCounter, Unit: UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.WALBytes) }},
	{Name: "wal_records", Help: "Records appended to the WAL.", Kind: StatCounter, Unit: UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.WALRecords) }},
	{Name: "wal_syncs", Help: "fdatasync calls on the WAL (each covers a group of commits).", Kind: StatCounter, Unit: UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.WALSyncs) }},
	{Name: "rows_per_sync", Help: "Rows written per WAL sync since start: the group commit factor.", Kind: StatGauge, Unit: UnitMilli,
		Value: func(s *Stats) uint64 { return statValue(s.rowsPerSyncMilli()) }},
	{Name: "last_lsn", Help: "Last LSN handed to the WAL.", Kind: StatGauge, Unit: UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.LastLSN) }},
	{Name: "commit_stall_longest", Help: "Longest time a commit waited for the disk page cache to make room.", Kind: StatGauge, Unit: UnitNanos,
		Value: func(s *Stats) uint64 { return statValue(s.LongestStall) }},

	// The disk page cache and the data files.
	{Name: "cache_hits", Help: "Page reads served from the disk page cache.", Kind: StatCounter, Unit: UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.CacheHits) }},
	{Name: "cache_misses", Help: "Page reads that needed the data file.", Kind: StatCounter, Unit: UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.CacheMisses) }},
	{Name: "cache_pages", Help: "Pages in the disk page cache.", Kind: StatGauge, Unit: UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.CachePages) }},
	{Name: "dirty_pages", Help: "Pages in the disk page cache changed since the last checkpoint.", Kind: StatGauge, Unit: UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.DirtyPages) }},
	{Name: "cache_bytes", Help: "Bytes of the disk page cache in use (frames, metadata and page index).", Kind: StatGauge, Unit: UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.CacheBytes) }},
	{Name: "disk_reads", Help: "Disk pages read from data files.", Kind: StatCounter, Unit: UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.DiskReads) }},
	{Name: "disk_writes", Help: "Disk pages written to data files by checkpoints.", Kind: StatCounter, Unit: UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.DiskWrites) }},

	// Checkpoints.
	{Name: "checkpoints", Help: "Checkpoints published.", Kind: StatCounter, Unit: UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.Checkpoints) }},
	{Name: "checkpoint_pages", Help: "Pages written by checkpoints.", Kind: StatCounter, Unit: UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.CheckpointPages) }},
	{Name: "checkpoint_last_duration", Help: "Duration of the last checkpoint.", Kind: StatGauge, Unit: UnitNanos,
		Value: func(s *Stats) uint64 { return statValue(s.LastCheckpoint) }},
	{Name: "checkpoint_lsn", Help: "LSN of the last published checkpoint; the WAL is replayed from it at start.", Kind: StatGauge, Unit: UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.CheckpointLSN) }},

	// Owners.
	{Name: "owners", Help: "Owners with a dedup window in the owners table.", Kind: StatGauge, Unit: UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.Owners) }},
	{Name: "owners_expired", Help: "Owners table entries expired: no table, no connection for Options.OwnerExpiry after their last batch.", Kind: StatCounter, Unit: UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.OwnersExpired) }},

	// etcd grants of cluster-managed tables.
	{Name: "grants_registered", Help: "etcd grants of cluster-managed tables accepted (verified in etcd, logged).", Kind: StatCounter, Unit: UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.GrantsRegistered) }},
	{Name: "grants_refused", Help: "etcd grants refused: not above the table's floor, or not the owner key etcd holds.", Kind: StatCounter, Unit: UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.GrantsRefused) }},
	{Name: "grants_unverified", Help: "etcd grants etcd could not confirm in time (unreachable or slow).", Kind: StatCounter, Unit: UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.GrantsUnverified) }},
	// Two-phase commit.
	{Name: "txn_prepared", Help: "Two-phase commit parts kept: prepared, or applied and not yet reported to the primary.", Kind: StatGauge, Unit: UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.TxnPrepared) }},
	{Name: "txn_decisions", Help: "Two-phase commit decisions kept as the primary, until every participant reported.", Kind: StatGauge, Unit: UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.TxnDecisions) }},
	{Name: "txn_in_doubt", Help: "Two-phase commit parts prepared for Options.TxnInDoubtAfter or longer, undecided: listed and aborted by `weft txn`.", Kind: StatGauge, Unit: UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.TxnInDoubt) }},
	{Name: "txn_commits", Help: "Prepared batches applied (decision commit).", Kind: StatCounter, Unit: UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.TxnCommits) }},
	{Name: "txn_aborts", Help: "Prepared batches dropped (decision abort).", Kind: StatCounter, Unit: UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.TxnAborts) }},
	{Name: "txn_resolved", Help: "Prepared transactions resolved by asking their primary (the coordinator did not finish them).", Kind: StatCounter, Unit: UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.TxnResolved) }},
	{Name: "txn_resolver_aborts", Help: "Aborts recorded as the primary for a resolver, the coordinator's lease gone.", Kind: StatCounter, Unit: UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.TxnResolverAborts) }},

	// Backups.
	{Name: "backups", Help: "Backups holding a snapshot now: meanwhile the WAL from its checkpoint on and the disk pages it maps are kept.", Kind: StatGauge, Unit: UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.Backups) }},
	{Name: "backup_held_pages", Help: "Disk pages checkpoints replaced but keep from reuse for running backups.", Kind: StatGauge, Unit: UnitCount,
		Value: func(s *Stats) uint64 { return statValue(s.BackupHeldPages) }},
}

// rowsPerSyncMilli is RowsWritten/WALSyncs in thousandths, 0 before the first sync.
func (s *Stats) rowsPerSyncMilli() uint64 {
	if s.WALSyncs == 0 {
		return 0
	}
	hi, lo := bits.Mul64(s.RowsWritten, 1000)
	if hi >= s.WALSyncs {
		return math.MaxUint64
	}
	q, _ := bits.Div64(hi, lo, s.WALSyncs)
	return q
}
