package storenode

import (
	"log/slog"
	"time"

	"github.com/weftdb/weft/internal/vfs"
)

// SyncMode says when a commit batch counts as durable.
type SyncMode uint8

const (
	// SyncAlways (the default) acknowledges a batch only after an fdatasync of the WAL covered
	// it: it survives power loss. One fdatasync covers every batch that arrived while the
	// previous one ran (group commit).
	SyncAlways SyncMode = iota
	// SyncNone acknowledges a batch once the WAL's write returned: the OS page cache survives
	// kill -9 of the storage node, but not power loss. Id and ownership grants are still synced.
	SyncNone
)

// String returns "always" or "none".
func (m SyncMode) String() string {
	if m == SyncNone {
		return "none"
	}
	return "always"
}

// ParseSyncMode parses "always" or "none".
func ParseSyncMode(s string) (SyncMode, bool) {
	switch s {
	case "always":
		return SyncAlways, true
	case "none":
		return SyncNone, true
	}
	return SyncAlways, false
}

// Defaults of Options, applied where a field is zero.
const (
	DefaultCacheBytes         = 1 << 30
	DefaultCheckpointWALBytes = 256 << 20
	DefaultCheckpointInterval = 5 * time.Minute
	DefaultLeaseDuration      = 10 * time.Second
	DefaultSeqGapWait         = 5 * time.Second
	DefaultWALSegmentBytes    = 64 << 20
	DefaultOwnerExpiry        = 24 * time.Hour
	DefaultMaxTables          = 4096
	DefaultBackupTimeout      = time.Hour
	DefaultTxnResolveAfter    = 5 * time.Second
	DefaultTxnResolveInterval = time.Second
	DefaultTxnAbortKeep       = 10 * time.Minute
	DefaultTxnCallTimeout     = 5 * time.Second
	DefaultMaxTxns            = 4096
	DefaultTxnForgetMax       = 65536
	DefaultMaxTxnBytes        = 256 << 20
	// Per owner (txn_quota.go) and in doubt (txn_doubt.go).
	DefaultMaxTxnsPerOwner     = 256
	DefaultMaxTxnBytesPerOwner = 16 << 20
	DefaultTxnInDoubtAfter     = 5 * time.Minute
	// MinCacheBytes is the smallest disk page cache: a handful of pages still works (commits
	// wait for checkpoints to make room), but not fewer than one batch can touch.
	MinCacheBytes = 16 << 10
)

// DefaultTxnResolvePrimariesMax is Options.TxnResolvePrimariesMax's default.
const DefaultTxnResolvePrimariesMax = 16

// Options configure Open. The zero value of every field means its default.
type Options struct {
	// Dir is the store's directory; it is created if missing.
	Dir string
	// FS is the file system; vfs.Default when nil. Tests pass a vfs.FaultFS.
	FS vfs.FS
	// Sync is the WAL's sync mode (SyncAlways by default).
	Sync SyncMode
	// CacheBytes bounds the disk page cache, in bytes: page frames plus per-frame metadata.
	// 0: DefaultCacheBytes (1 GiB); below MinCacheBytes (16 KiB): MinCacheBytes.
	CacheBytes int64
	// CheckpointWALBytes starts a background checkpoint once the WAL grew this many bytes since
	// the last one began, and at least the dirty pages' bytes (docs/storage.md, "Checkpoint").
	// 0: DefaultCheckpointWALBytes (256 MiB); negative disables the trigger.
	CheckpointWALBytes int64
	// CheckpointInterval starts a background checkpoint this long after the last one when
	// anything is dirty. 0: DefaultCheckpointInterval (5 min); negative disables the timer.
	CheckpointInterval time.Duration
	// LeaseDuration is how long an ownership grant lives without traffic from its owner.
	// 0: DefaultLeaseDuration (10 s).
	LeaseDuration time.Duration
	// SeqGapWait bounds how long a batch waits for the batches before it in its owner's seq
	// order before failing with ErrSeqGap. 0: DefaultSeqGapWait (5 s).
	SeqGapWait time.Duration
	// OwnerExpiry is how long an owner with no table and no connection keeps its owners-table
	// entry (its dedup window) after its last applied batch or Open, whichever is later.
	// 0: DefaultOwnerExpiry (24 h); negative keeps every owner for ever.
	OwnerExpiry time.Duration
	// MaxTables bounds the live tables, dropped ones counted until a checkpoint removes their
	// files; CreateTable fails with ErrTooManyTables beyond it. 0 or negative:
	// DefaultMaxTables (4096). docs/storage.md, "Tables and file descriptors".
	MaxTables int
	// MaxTablesPerOwner bounds the tables one owner's CreateTableAs may have here: held by it,
	// or created by it since Open and granted to nobody, dropped ones counted as for MaxTables.
	// Beyond: ErrTooManyTables. 0 or negative: MaxTables/8, at least 1. docs/storage.md.
	MaxTablesPerOwner int
	// WALSegmentBytes is the size at which the WAL rolls to a new segment file, in bytes.
	// 0: DefaultWALSegmentBytes (64 MiB).
	WALSegmentBytes int64
	// WALGather turns on the WAL's group gathering under SyncAlways (wal.Options.Gather).
	// Off by default: it pays only when committers come back at once (docs/wal.md, "Gathering").
	WALGather bool
	// ExpireLeasesAtOpen ends, at Open, the leases of the owners recorded in the store instead
	// of renewing them: right for an embedded engine, wrong for a storage node
	// (docs/storage.md, "Options: the reasons").
	ExpireLeasesAtOpen bool
	// BackupTimeout bounds how long a backup holds its snapshot (Engine.Backup); past it the
	// backup fails with ErrBackupTimeout and releases its hold. 0 or negative:
	// DefaultBackupTimeout (1 h). docs/operations.md, "Backup and restore".
	BackupTimeout time.Duration
	// GrantVerifier, package cluster's cluster.GrantVerifier, proves the etcd grants of
	// cluster-managed tables (cluster.go) and reads etcd's revision for a restored copy's first
	// open. Nil: etcd grants are refused (ErrNoVerifier), and so is the first open of a
	// restored copy holding cluster tables; local tables work as without it.
	GrantVerifier GrantVerifier
	// GrantVerifyTimeout bounds one grant verification or revision read. 0 or negative:
	// DefaultGrantVerifyTimeout (5 s).
	GrantVerifyTimeout time.Duration
	// LeaseChecker tells a primary whether a coordinator's lease is alive (txn.go). Nil: an
	// undecided transaction is never resolved to abort here, and a commit decision is taken
	// without the check.
	LeaseChecker LeaseChecker
	// TxnPeer reaches other storage nodes, the primaries of the transactions prepared here;
	// without one, only transactions whose primary is this node are resolved.
	TxnPeer TxnPeer
	// TxnResolveAfter is how long a prepared transaction waits for its coordinator before
	// the resolver asks its primary (engine clock). 0 or negative: DefaultTxnResolveAfter (5 s).
	TxnResolveAfter time.Duration
	// TxnResolveInterval is the resolver's period (it also runs when a decision is applied).
	// 0: DefaultTxnResolveInterval (1 s); negative: no background resolver (ResolveTxns by hand).
	TxnResolveInterval time.Duration
	// TxnAbortKeep is how long a primary keeps an abort that not every participant reported.
	// 0 or negative: DefaultTxnAbortKeep (10 min).
	TxnAbortKeep time.Duration
	// TxnCallTimeout bounds each call of the resolver to a primary and its lease checks.
	// 0 or negative: DefaultTxnCallTimeout (5 s).
	TxnCallTimeout time.Duration
	// TxnResolvePrimariesMax bounds the primaries one resolver pass calls at once; a pass
	// retries at most half as many that failed (txn_resolve.go). 0 or negative: 16. Keep it at
	// most the TxnPeer's connection bound (server.PeerConfig.PeersMax, 64). docs/cluster.md.
	TxnResolvePrimariesMax int
	// MaxTxns bounds the prepared transactions (16 x MaxTxns the applied ones waiting to report
	// to their primary), and separately the kept decisions; beyond, PrepareTxn and DecideTxn
	// fail with ErrTxnBusy. 0 or negative: DefaultMaxTxns (4096).
	MaxTxns int
	// TxnForgetMax bounds the decisions a primary remembers after forgetting them (each for
	// TxnAbortKeep at most, about 100 bytes); beyond, the oldest give way. 0 or negative:
	// DefaultTxnForgetMax (65536). docs/cluster.md, "The primary".
	TxnForgetMax int
	// MaxTxnBytes bounds the bytes of the prepared batches held in memory (and re-logged by
	// each checkpoint); beyond, PrepareTxn fails with ErrTxnBusy. 0 or negative:
	// DefaultMaxTxnBytes (256 MiB).
	MaxTxnBytes int64
	// MaxTxnsPerOwner bounds the transactions one owner holds prepared here, and separately
	// the decisions kept for its parts (txn_decisions.go: DecideTxnAs); beyond, that owner's
	// fail with ErrTxnBusy while other owners' go on. 0 or negative: DefaultMaxTxnsPerOwner (256).
	MaxTxnsPerOwner int
	// MaxTxnBytesPerOwner bounds the bytes of one owner's prepared batches here, as
	// MaxTxnsPerOwner. 0 or negative: DefaultMaxTxnBytesPerOwner (16 MiB).
	MaxTxnBytesPerOwner int64
	// TxnInDoubtAfter is how long a part stays prepared, undecided, before it is in doubt:
	// listed by TxnsInDoubt and abortable by an operator (AbortInDoubt). 0 or negative:
	// DefaultTxnInDoubtAfter (5 min).
	TxnInDoubtAfter time.Duration
	// Now is the clock for leases; time.Now when nil. Tests inject a fake clock.
	Now func() time.Time
	// Proposer, when set, makes the engine a replica of a replicated store (proposer.go,
	// docs/replication.md): its records go to the Proposer instead of the WAL, and their
	// effects are applied by ApplyCommitted once committed. nil: standalone, the WAL path.
	Proposer Proposer
	// Logger receives checkpoint and recovery events; slog.Default() when nil.
	Logger *slog.Logger

	// ckptRetryAfter replaces the timer of a deferred checkpoint's retry (tests).
	ckptRetryAfter func(time.Duration) <-chan time.Time
}

func (o Options) withDefaults() Options {
	if o.FS == nil {
		o.FS = vfs.Default
	}
	if o.CacheBytes == 0 {
		o.CacheBytes = DefaultCacheBytes
	}
	if o.CacheBytes < MinCacheBytes {
		o.CacheBytes = MinCacheBytes
	}
	if o.CheckpointWALBytes == 0 {
		o.CheckpointWALBytes = DefaultCheckpointWALBytes
	}
	if o.CheckpointInterval == 0 {
		o.CheckpointInterval = DefaultCheckpointInterval
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration = DefaultLeaseDuration
	}
	if o.SeqGapWait == 0 {
		o.SeqGapWait = DefaultSeqGapWait
	}
	if o.OwnerExpiry == 0 {
		o.OwnerExpiry = DefaultOwnerExpiry
	}
	if o.MaxTables <= 0 {
		o.MaxTables = DefaultMaxTables
	}
	if o.MaxTablesPerOwner <= 0 {
		o.MaxTablesPerOwner = max(1, o.MaxTables/8)
	}
	if o.WALSegmentBytes == 0 {
		o.WALSegmentBytes = DefaultWALSegmentBytes
	}
	if o.BackupTimeout <= 0 {
		o.BackupTimeout = DefaultBackupTimeout
	}
	if o.GrantVerifyTimeout <= 0 {
		o.GrantVerifyTimeout = DefaultGrantVerifyTimeout
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.TxnResolveAfter <= 0 {
		o.TxnResolveAfter = DefaultTxnResolveAfter
	}
	if o.TxnResolveInterval == 0 {
		o.TxnResolveInterval = DefaultTxnResolveInterval
	}
	if o.TxnAbortKeep <= 0 {
		o.TxnAbortKeep = DefaultTxnAbortKeep
	}
	if o.TxnCallTimeout <= 0 {
		o.TxnCallTimeout = DefaultTxnCallTimeout
	}
	if o.TxnResolvePrimariesMax <= 0 {
		o.TxnResolvePrimariesMax = DefaultTxnResolvePrimariesMax
	}
	if o.MaxTxns <= 0 {
		o.MaxTxns = DefaultMaxTxns
	}
	if o.TxnForgetMax <= 0 {
		o.TxnForgetMax = DefaultTxnForgetMax
	}
	if o.MaxTxnBytes <= 0 {
		o.MaxTxnBytes = DefaultMaxTxnBytes
	}
	if o.MaxTxnsPerOwner <= 0 {
		o.MaxTxnsPerOwner = DefaultMaxTxnsPerOwner
	}
	if o.MaxTxnBytesPerOwner <= 0 {
		o.MaxTxnBytesPerOwner = DefaultMaxTxnBytesPerOwner
	}
	if o.TxnInDoubtAfter <= 0 {
		o.TxnInDoubtAfter = DefaultTxnInDoubtAfter
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}
