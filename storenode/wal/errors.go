package wal

import "errors"

// Errors of appending and syncing.
var (
	// ErrClosed is returned by every call on a WAL after Close has begun.
	ErrClosed = errors.New("wal: closed")
	// ErrFailStop is wrapped by the sticky error of a WAL whose write or fsync failed: the
	// record of the failed group, every later record and every later call fail with it, and
	// the WAL never retries (an fsync that failed once may have dropped the dirty pages).
	// The cause stays wrapped too, so errors.Is(err, syscall.ENOSPC) tells a full disk.
	// Reopening the directory recovers.
	ErrFailStop = errors.New("wal: failed, reopen to recover")
	// ErrBusy is returned by AppendAsync when the queue of records waiting for the writer
	// holds Options.MaxQueueBytes already; the record was not queued and done is not called.
	ErrBusy = errors.New("wal: queue full")
	// ErrTooLarge is returned for a payload longer than Options.MaxRecordBytes.
	ErrTooLarge = errors.New("wal: record too large")
	// ErrUnknownOutcome is wrapped (with the context's error) by Append when its context ends
	// after the record was queued, and (with ErrFailStop) by the error of every record of a
	// group whose write or fsync failed: the record may or may not become durable (after an
	// fsync error the pages may reach the disk later, or a restart may read them from the OS
	// page cache).
	ErrUnknownOutcome = errors.New("wal: outcome unknown")
)

// Errors of reading.
var (
	// ErrDropped is wrapped by ReadRecords when a segment it needs was dropped (DropBefore).
	ErrDropped = errors.New("wal: segment dropped")
)

// Errors of opening.
var (
	// ErrBadOptions is wrapped by Open for options out of range.
	ErrBadOptions = errors.New("wal: bad options")
)

// Recovery reports a bad log through corrupt.Errorf, so errors.Is(err, corrupt.ErrCorruption)
// holds; the message names the segment file and the byte offset.

// errEndOfLog marks an all-zero record header: the end of the written records (preallocated or
// never-written space). It is wrapped in a corruption error like every other bad header, and
// recovery treats it like any other bad record: torn tail unless a later valid record covers it.
var errEndOfLog = errors.New("wal: end of log (zero header)")
