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
	// CacheBytes bounds the disk page cache: page frames plus per-frame metadata.
	CacheBytes int64
	// CheckpointWALBytes starts a background checkpoint when the WAL has grown by this many
	// bytes since the last one began, and by at least the bytes of the dirty pages (so the
	// pages checkpoints write stay about the bytes logged however large the dirty set; the
	// cache trigger of docs/storage.md bounds it). Negative disables the trigger.
	CheckpointWALBytes int64
	// CheckpointInterval starts a background checkpoint this long after the last one when
	// anything is dirty. Negative disables the timer.
	CheckpointInterval time.Duration
	// LeaseDuration is how long an ownership grant lives without traffic from its owner.
	LeaseDuration time.Duration
	// SeqGapWait bounds how long a batch waits for the batches before it in its owner's seq
	// order before failing with ErrSeqGap.
	SeqGapWait time.Duration
	// OwnerExpiry is how long an owner that holds no table and has no connection keeps its
	// entry in the owners table (its dedup window) after its last applied batch; the count
	// restarts at Open. Negative keeps every owner for ever.
	OwnerExpiry time.Duration
	// MaxTables bounds the live tables (each keeps its data file open); CreateTable fails
	// with ErrTooManyTables beyond it.
	MaxTables int
	// MaxTablesPerOwner bounds the tables one owner's CreateTableAs (a client's CreateTable)
	// may have here, so that one client cannot take all of MaxTables: those whose holder is
	// the owner, and those it created since Open that nobody was granted yet (the catalog
	// records no creator); dropped ones count until a checkpoint removes their files, as for
	// MaxTables. CreateTableAs fails with ErrTooManyTables beyond it. 0: MaxTables/8, at
	// least 1.
	MaxTablesPerOwner int
	// WALSegmentBytes is the size at which the WAL rolls to a new segment file.
	WALSegmentBytes int64
	// WALGather turns on the WAL's group gathering under SyncAlways (wal.Options.Gather):
	// faster when committers come back at once (1.6x for 128 in-process committers), slower
	// end to end over TCP, so off by default (docs/wal.md, "Gathering").
	WALGather bool
	// ExpireLeasesAtOpen ends, at Open, the leases of the owners recorded in the store, instead
	// of giving them a fresh lease. Right for an embedded engine: the directory lock proves the
	// process that held them is gone. Wrong for a storage node, whose owners outlive it.
	ExpireLeasesAtOpen bool
	// BackupTimeout bounds how long a backup holds its snapshot (Engine.Backup): meanwhile
	// checkpoints keep the disk pages they replace, so the data files grow. A backup that
	// takes longer fails with ErrBackupTimeout and releases its hold.
	BackupTimeout time.Duration
	// GrantVerifier proves the etcd grants of cluster-managed tables (cluster.go) and reads
	// etcd's revision for a restored copy's first open. Nil: this node refuses etcd grants
	// (ErrNoVerifier) and the first open of a restored copy holding cluster tables; local
	// tables work as without it. Package cluster implements it (cluster.GrantVerifier).
	GrantVerifier GrantVerifier
	// GrantVerifyTimeout bounds one grant verification or revision read
	// (DefaultGrantVerifyTimeout when zero).
	GrantVerifyTimeout time.Duration
	// LeaseChecker tells a primary whether a coordinator's lease is alive (txn.go): without
	// one, an undecided transaction is never resolved to abort here, and a commit decision is
	// taken without the check.
	LeaseChecker LeaseChecker
	// TxnPeer reaches other storage nodes, the primaries of the transactions prepared here;
	// without one, only transactions whose primary is this node are resolved.
	TxnPeer TxnPeer
	// TxnResolveAfter is how long a prepared transaction waits for its coordinator before
	// the resolver asks its primary (engine clock).
	TxnResolveAfter time.Duration
	// TxnResolveInterval is the resolver's period (it also runs when a decision is applied);
	// negative: no background resolver (ResolveTxns by hand).
	TxnResolveInterval time.Duration
	// TxnAbortKeep is how long a primary keeps an abort that not every participant reported.
	TxnAbortKeep time.Duration
	// TxnCallTimeout bounds each call of the resolver to a primary and its lease checks.
	TxnCallTimeout time.Duration
	// TxnResolvePrimariesMax bounds how many primaries one resolver pass calls at once (each
	// primary's transactions are asked about one after another, distinct primaries
	// concurrently, so N unreachable primaries cost one TxnCallTimeout, not N; a primary
	// that failed backs off, and a pass retries at most half of this many of them:
	// txn_resolve.go); 0: 16. Keep it at most the TxnPeer's connection bound
	// (server.PeerConfig.PeersMax, 64).
	TxnResolvePrimariesMax int
	// MaxTxns bounds the prepared transactions (not the applied ones waiting to report to
	// their primary: those at 16 x MaxTxns), and separately the kept decisions; beyond,
	// PrepareTxn and DecideTxn fail with ErrTxnBusy.
	MaxTxns int
	// TxnForgetMax bounds the decisions a primary remembers after forgetting them (each
	// TxnAbortKeep at most, about 100 bytes each: a resent Decide of one is answered with
	// it); beyond, the oldest give way. 0: DefaultTxnForgetMax.
	TxnForgetMax int
	// MaxTxnBytes bounds the bytes of the prepared batches held in memory (and re-logged by
	// each checkpoint); beyond, PrepareTxn fails with ErrTxnBusy.
	MaxTxnBytes int64
	// MaxTxnsPerOwner bounds the transactions one owner holds prepared here, and
	// separately the decisions kept here for its parts (txn_decisions.go), and
	// MaxTxnBytesPerOwner the bytes of their prepared batches; beyond, that owner's
	// PrepareTxn fails with ErrTxnBusy while other owners still prepare (an owner whose
	// transactions' primary is unreachable cannot take the whole of MaxTxns or MaxTxnBytes).
	// 0: DefaultMaxTxnsPerOwner (256), DefaultMaxTxnBytesPerOwner (16 MiB).
	MaxTxnsPerOwner     int
	MaxTxnBytesPerOwner int64
	// TxnInDoubtAfter is how long a part stays prepared, undecided, before it is in doubt:
	// listed by TxnsInDoubt and abortable by an operator (AbortInDoubt). 0:
	// DefaultTxnInDoubtAfter (5 min).
	TxnInDoubtAfter time.Duration
	// Now is the clock for leases; time.Now when nil. Tests inject a fake clock.
	Now func() time.Time
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
