package storenode

import (
	"errors"

	"github.com/weftdb/weft/base"
)

// Errors of the storage engine, grouped by when they occur. Each reads "storenode: ..." (an
// embedded engine's errors never read as the wire's), and each one a client can meet travels
// as one of the wire's codes: a twin (base.NewSentinel) matches the wire's sentinel of its code
// both ways under errors.Is, so errors.Is(err, storenode.ErrFenced) holds for an embedded
// engine's error and for one that crossed TCP alike, and so does errors.Is(err,
// base.ErrFenced). A narrower error (ErrTooManyTables, ErrSeqReused, ...) wraps the wire's
// sentinel: it matches that one, but over TCP only the wire's coarser error arrives. Checksum
// and format failures of stored data wrap corrupt.ErrCorruption instead.
var (
	// Opening.

	// ErrLocked is returned by Open when another process holds the store's directory (when
	// this process does, the error is ErrAlreadyOpen, which matches ErrLocked too).
	ErrLocked = errors.New("storenode: store directory is locked by another process")
	// ErrAlreadyOpen is returned by Open for a directory that an engine of this process has
	// open (Close it first, or share the one Engine): it matches ErrLocked too.
	ErrAlreadyOpen = newSentinel("storenode: store directory is already open in this process", ErrLocked)
	// ErrOldFormat is returned by Open for a store whose meta file, or a WAL record to
	// replay (a commit record of the first format), an older build wrote in a format this
	// build does not read.
	ErrOldFormat = errors.New("storenode: store written in an older format")
	// ErrNotStore is returned by Check for a directory that is missing or holds neither a
	// meta file nor a wal directory.
	ErrNotStore = errors.New("storenode: not a Weft store")

	// ErrBackupIncomplete is returned by Open for a directory a backup was still writing (or
	// was abandoned in): it holds part of a store. Delete it and take the backup again.
	ErrBackupIncomplete = errors.New("storenode: directory holds an incomplete backup")

	// Backup.

	// ErrBackupTimeout is returned by Backup when it held its snapshot longer than
	// Options.BackupTimeout (a slow or stalled sink); the hold is released.
	ErrBackupTimeout = newSentinel("storenode: backup took longer than its time limit", base.ErrBusy)
	// ErrBackupBusy is returned by Backup while four backups run already.
	ErrBackupBusy = newSentinel("storenode: too many backups running", base.ErrBusy)

	// Tables.

	// ErrTableNotFound is returned for a table name or id that does not exist (or was dropped).
	ErrTableNotFound = base.NewSentinel(base.CodeTableNotFound, "storenode: table not found")
	// ErrTableExists is returned by CreateTable for a name already in use.
	ErrTableExists = base.NewSentinel(base.CodeTableExists, "storenode: table exists")
	// ErrBadName is returned for a table name outside 1..64 bytes of [A-Za-z0-9_.-].
	ErrBadName = base.NewSentinel(base.CodeBadName, "storenode: bad table name")
	// ErrTooManyTables is returned by CreateTable when the store holds Options.MaxTables
	// tables, and for an open of a data file that failed for want of file descriptors (EMFILE,
	// ENFILE): that request fails, the engine goes on.
	ErrTooManyTables = newSentinel("storenode: too many tables", base.ErrBusy)
	// ErrRowSize is returned for a row size outside 8..4096 or not a multiple of 8, and for rows
	// whose size does not match their table's.
	ErrRowSize = base.NewSentinel(base.CodeBadRowSize, "storenode: bad row size")

	// Ownership and ordering.

	// ErrTableOwned is returned by Acquire while another owner holds a live lease, and by
	// DropTable from a session that does not hold the table while another owner's lease is
	// live.
	ErrTableOwned = base.NewSentinel(base.CodeOwned, "storenode: table owned by another transaction node")
	// ErrOwnerInUse is returned by Connect (the storage node's handshake) for an owner id whose
	// holder, another incarnation, is live: it has neither released it (Release, Close) nor
	// been silent for a lease.
	ErrOwnerInUse = base.NewSentinel(base.CodeOwnerInUse, "storenode: owner id in use by another live incarnation")
	// ErrIdentityLost is returned for a request acting as the owner from a connection that no
	// longer holds the owner id (HoldsIdent false: a later claim replaced it, or the id was
	// released). Not ErrFenced: the owner's grants are untouched; the request was not
	// executed.
	ErrIdentityLost = base.NewSentinel(base.CodeIdentityLost, "storenode: this connection no longer holds its owner id")
	// ErrSeqReused is returned for a batch under a seq its owner already applied with other
	// bytes (another incarnation, a bug): it is rejected, never acknowledged.
	ErrSeqReused = newSentinel("storenode: batch seq already applied with other bytes", ErrFenced)
	// ErrFenced is returned for a commit or id grant whose owner or epoch is not the table's
	// current grant: a stale owner can never overwrite a newer owner's rows.
	ErrFenced = base.NewSentinel(base.CodeFenced, "storenode: fenced: stale epoch or not the owner")
	// ErrSeqGap is returned when an owner's batch waited longer than Options.SeqGapWait for
	// the batches before it in seq order.
	ErrSeqGap = base.NewSentinel(base.CodeSeqGap, "storenode: gap in owner's batch sequence")

	// Cluster-managed tables (cluster.go).

	// ErrGrantKind is returned for a grant of the wrong kind for its table: a local-counter
	// Acquire (or renewal) of a cluster-managed table, or an etcd grant of a local table. Over
	// the wire it reads as ErrMalformed.
	ErrGrantKind = newSentinel("storenode: grant of the wrong kind for the table (local counter or etcd)", ErrMalformed)
	// ErrNoVerifier is returned for an etcd grant to a storage node without etcd configured
	// (Options.GrantVerifier), and by the first Open of a restored copy holding cluster
	// tables without it. Over the wire it reads as base.ErrUnsupported.
	ErrNoVerifier = newSentinel("storenode: no etcd configured to verify grants", base.ErrUnsupported)
	// ErrGrantUnverified is returned when an etcd grant could not be verified in time (etcd
	// unreachable, slow, or too many verifications waiting): nothing changed, retry later.
	// Over the wire it reads as base.ErrBusy.
	ErrGrantUnverified = newSentinel("storenode: etcd grant could not be verified", base.ErrBusy)

	// Two-phase commit (txn.go).

	// ErrTxnLocked is returned for a commit or prepare touching a row of a prepared
	// transaction whose decision is not applied yet, and for DropTable of a table it writes.
	ErrTxnLocked = base.NewSentinel(base.CodeTxnLocked, "storenode: rows locked by a prepared transaction")
	// ErrTxnDecided is returned when a transaction's recorded (or applied) decision is not
	// the one asked for; the message names the recorded decision.
	ErrTxnDecided = base.NewSentinel(base.CodeTxnDecided, "storenode: transaction already decided otherwise")
	// ErrTxnBusy is returned when Options.MaxTxns transactions are prepared, or decisions
	// kept.
	ErrTxnBusy = base.NewSentinel(base.CodeTxnBusy, "storenode: too many transactions in doubt")
	// ErrTxnNotPrepared is returned by DecideTxn for a commit of a transaction whose part
	// this node, its primary, does not hold prepared, and by DecideTxnAs for a decision of a
	// part another owner prepared, or under another lease. It matches ErrTxnDecided (the
	// transaction cannot commit here), and reads as it over the wire.
	ErrTxnNotPrepared = newSentinel("storenode: transaction not prepared here by this owner", ErrTxnDecided)
	// ErrTxnNotInDoubt is returned by AbortInDoubt for a transaction not prepared here, or
	// prepared for less than Options.TxnInDoubtAfter. Over the wire it reads as ErrMalformed.
	ErrTxnNotInDoubt = newSentinel("storenode: transaction not in doubt here", ErrMalformed)

	// Partition moves (move.go).

	// ErrMoved is returned for a grant, id grant or commit of a table frozen for a move,
	// incoming or retired, and for a read of an incoming or retired one. It matches
	// ErrFenced (the owner's grant here is over: it re-acquires, on the map's new node).
	ErrMoved = base.NewSentinel(base.CodeMoved, "storenode: partition moving or moved to another storage node")
	// ErrMoveLost is returned by MoveChanges for a mark that is gone (a restart, a newer mark).
	ErrMoveLost = base.NewSentinel(base.CodeMoveLost, "storenode: partition move's change mark lost")
	// ErrMoveState is returned for a move step the table's move state does not allow (a
	// freeze of an incoming copy, an activation of a live table, ...). Over the wire it reads
	// as ErrMalformed.
	ErrMoveState = newSentinel("storenode: table is not in the move state this step needs", ErrMalformed)

	// Input.

	// ErrMalformed is returned for a request that breaks the protocol's rules (a segment of a
	// table missing from the batch's fences, a page beyond the last one, an empty batch).
	ErrMalformed = base.NewSentinel(base.CodeMalformed, "storenode: malformed request")
	// ErrBatchTooLarge is returned for a commit batch touching more pages than the engine
	// takes in one batch.
	ErrBatchTooLarge = newSentinel("storenode: batch too large", base.ErrFrameTooLarge)

	// Failure.

	// ErrFailStop is returned by every commit, grant and read after a write or sync of the WAL
	// or of a checkpoint failed: the engine stops rather than retry and pretend (an fsync error
	// may have dropped dirty pages from the OS cache). Reopening recovers from the durable state.
	ErrFailStop = base.NewSentinel(base.CodeFailStop, "storenode: stopped after an IO failure")
	// ErrUnknownOutcome is returned for a batch that may or may not be durable: its WAL write or
	// fsync failed (it may still be found after a restart), a retry of it waited for an LSN
	// whose write failed, or it is a retry of a seq applied before the dedup window.
	ErrUnknownOutcome = base.NewSentinel(base.CodeUnknownOutcome, "storenode: batch outcome unknown")
	// ErrCheckpointDeferred is returned by a checkpoint abandoned for want of file
	// descriptors (EMFILE, ENFILE) before it published anything: the engine goes on, and the
	// background loop tries again (ckpt_defer.go). It wraps the cause.
	ErrCheckpointDeferred = newSentinel("storenode: checkpoint deferred: out of file descriptors", base.ErrBusy)
	// ErrClosed is returned by every call after Close.
	ErrClosed = newSentinel("storenode: engine closed", base.ErrShuttingDown)

	// Replication (proposer.go). Not on the wire yet (stage R5 gives them codes).

	// ErrNotLeader is what a Proposer returns for a proposal it refused because its replica
	// is not the group's leader: nothing was proposed, the request may go to the leader.
	ErrNotLeader = errors.New("storenode: not the leader of the replica group")
	// ErrNotReplicated is returned under Options.Proposer by the requests whose record kind
	// is not replicated yet: two-phase commit and moves (their checkpoint carries need a
	// replica's txnstate file first, docs/replication.md 5).
	ErrNotReplicated = errors.New("storenode: not replicated yet")
)

// sentinel is an error with a fixed message that also matches its parent under errors.Is (the
// wire's coarser sentinel, or ErrLocked), without reading as it.
type sentinel struct {
	msg    string
	parent error
}

func newSentinel(msg string, parent error) error { return &sentinel{msg: msg, parent: parent} }

// Error reports the sentinel's message.
func (e *sentinel) Error() string { return e.msg }

// Unwrap reports the parent, so errors.Is finds it.
func (e *sentinel) Unwrap() error { return e.parent }
