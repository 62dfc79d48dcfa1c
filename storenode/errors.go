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

	// Tables.

	// ErrTableNotFound is returned for a table name or id that does not exist (or was dropped).
	ErrTableNotFound = sgio.ErrTableNotFound
	// ErrTableExists is returned by CreateTable for a name already in use.
	ErrTableExists = sgio.ErrTableExists
	// ErrBadName is returned for a table name outside 1..64 bytes of [A-Za-z0-9_.-].
	ErrBadName = sgio.ErrBadName
	// ErrRowSize is returned for a row size outside 8..4096 or not a multiple of 8, and for rows
	// whose size does not match their table's.
	ErrRowSize = sgio.ErrBadRowSize

	// Ownership and ordering.

	// ErrTableOwned is returned by Acquire while another owner holds a live lease.
	ErrTableOwned = sgio.ErrOwned
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
	// ErrTransportStopped is reported by Server.Healthy (and returned by Serve) once the
	// server's network transport stopped on its own: it no longer serves.
	ErrTransportStopped = fmt.Errorf("storenode: network transport stopped: %w", sgio.ErrShuttingDown)
	// ErrClosed is returned by every call after Close.
	ErrClosed = fmt.Errorf("storenode: engine closed: %w", sgio.ErrShuttingDown)
)
