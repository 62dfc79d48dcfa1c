package storenode

import (
	"errors"
	"fmt"

	"github.com/weftdb/weft/sgio"
)

// Errors of the storage engine, grouped by when they occur. Those a client can meet are the
// wire's sentinels (package sgio), so a transaction node gets the same error, errors.Is and
// all, from an embedded engine and from a storage node over TCP. Checksum and format failures
// of stored data wrap corrupt.ErrCorruption instead.
var (
	// Opening.

	// ErrLocked is returned by Open when another process holds the store's directory.
	ErrLocked = errors.New("storenode: store directory is locked by another process")
	// ErrOldFormat is returned by Open for a store whose meta file an older build wrote in a
	// format this build does not read.
	ErrOldFormat = errors.New("storenode: store written in an older format")
	// ErrFileLimit is returned by Open and NewServer when the process's file descriptor limit
	// (RLIMIT_NOFILE) cannot hold the tables' data files, the connections and a margin.
	ErrFileLimit = errors.New("storenode: file descriptor limit too low")

	// ErrBackupIncomplete is returned by Open for a directory a backup was still writing (or
	// was abandoned in): it holds part of a store. Delete it and take the backup again.
	ErrBackupIncomplete = errors.New("storenode: directory holds an incomplete backup")

	// Backup.

	// ErrBackupTimeout is returned by Backup when it held its snapshot longer than
	// Options.BackupTimeout (a slow or stalled sink); the hold is released.
	ErrBackupTimeout = fmt.Errorf("storenode: backup took longer than its time limit: %w", sgio.ErrBusy)
	// ErrBackupBusy is returned by Backup while four backups run already.
	ErrBackupBusy = fmt.Errorf("storenode: too many backups running: %w", sgio.ErrBusy)

	// Tables.

	// ErrTableNotFound is returned for a table name or id that does not exist (or was dropped).
	ErrTableNotFound = sgio.ErrTableNotFound
	// ErrTableExists is returned by CreateTable for a name already in use.
	ErrTableExists = sgio.ErrTableExists
	// ErrBadName is returned for a table name outside 1..64 bytes of [A-Za-z0-9_.-].
	ErrBadName = sgio.ErrBadName
	// ErrTooManyTables is returned by CreateTable when the store holds Options.MaxTables
	// tables, and for an open of a data file that failed for want of file descriptors (EMFILE,
	// ENFILE): that request fails, the engine goes on.
	ErrTooManyTables = fmt.Errorf("storenode: too many tables: %w", sgio.ErrBusy)
	// ErrRowSize is returned for a row size outside 8..4096 or not a multiple of 8, and for rows
	// whose size does not match their table's.
	ErrRowSize = sgio.ErrBadRowSize

	// Ownership and ordering.

	// ErrTableOwned is returned by Acquire while another owner holds a live lease, and by
	// DropTable from a session that does not hold the table while another owner's lease is
	// live.
	ErrTableOwned = sgio.ErrOwned
	// ErrOwnerInUse is returned by Connect (the storage node's handshake) for an owner id whose
	// holder, another incarnation, is live: it has neither released it (Release, Close) nor
	// been silent for a lease.
	ErrOwnerInUse = sgio.ErrOwnerInUse
	// ErrSeqReused is returned for a batch under a seq its owner already applied with other
	// bytes (another incarnation, a bug): it is rejected, never acknowledged.
	ErrSeqReused = fmt.Errorf("storenode: batch seq already applied with other bytes: %w", sgio.ErrFenced)
	// ErrFenced is returned for a commit or id grant whose owner or epoch is not the table's
	// current grant: a stale owner can never overwrite a newer owner's rows.
	ErrFenced = sgio.ErrFenced
	// ErrSeqGap is returned when an owner's batch waited longer than Options.SeqGapWait for
	// the batches before it in seq order.
	ErrSeqGap = sgio.ErrSeqGap

	// Input.

	// ErrMalformed is returned for a request that breaks the protocol's rules (a segment of a
	// table missing from the batch's fences, a page beyond the last one, an empty batch).
	ErrMalformed = sgio.ErrMalformed
	// ErrBatchTooLarge is returned for a commit batch touching more pages than the engine
	// takes in one batch.
	ErrBatchTooLarge = fmt.Errorf("storenode: batch too large: %w", sgio.ErrFrameTooLarge)

	// Failure.

	// ErrFailStop is returned by every commit, grant and read after a write or sync of the WAL
	// or of a checkpoint failed: the engine stops rather than retry and pretend (an fsync error
	// may have dropped dirty pages from the OS cache). Reopening recovers from the durable state.
	ErrFailStop = sgio.ErrFailStop
	// ErrUnknownOutcome is returned for a batch that may or may not be durable: its WAL write or
	// fsync failed (it may still be found after a restart), a retry of it waited for an LSN
	// whose write failed, or it is a retry of a seq applied before the dedup window.
	ErrUnknownOutcome = sgio.ErrUnknownOutcome
	// ErrTransportStopped is reported by Server.Healthy (and returned by Serve) once the
	// server's network transport stopped on its own: it no longer serves.
	ErrTransportStopped = fmt.Errorf("storenode: network transport stopped: %w", sgio.ErrShuttingDown)
	// ErrClosed is returned by every call after Close.
	ErrClosed = fmt.Errorf("storenode: engine closed: %w", sgio.ErrShuttingDown)
)
