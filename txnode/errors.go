package txnode

import (
	"errors"
	"fmt"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/txnode/store"
)

// Errors of the transaction node, and of the storage node as a game server meets them: every
// error a game handles is one of these (no need to import storenode). The storage node's
// arrive as its own sentinels, for the embedded and the remote store alike: an embedded
// engine's read "storenode: ...", and one that crossed TCP carries its wire code, so
// errors.Is matches the same sentinel either way.
var (
	// ErrNotFound is returned for a row id that holds no row.
	ErrNotFound = errors.New("txnode: row not found")
	// ErrConflict is returned when a transaction kept conflicting with concurrent ones after
	// Options.MaxRetries attempts (or at once, for a manual Tx).
	ErrConflict = errors.New("txnode: transaction conflict")
	// ErrClosed is returned by every call after Close (and by one that raced Close into the
	// store: the store's own error wraps it, store.ErrClosed).
	ErrClosed = store.ErrClosed
	// ErrRowSize is returned for a row (or a buffer, or a codec) whose length is not its
	// table's row size, and by CreateTable for a row size outside 8..4096 or not a multiple of
	// 8 (the store's error, which it matches under errors.Is).
	ErrRowSize = base.NewSentinel(base.CodeBadRowSize, "txnode: row size does not match the table")
	// ErrTableOwned is returned by Open or CreateTable when another transaction node holds
	// the table's write ownership.
	ErrTableOwned = storenode.ErrTableOwned
	// ErrOwnerInUse is returned by Open when another live transaction node (another
	// incarnation) holds Options.OwnerID at the storage node for longer than
	// Options.OwnerInUseWait.
	ErrOwnerInUse = storenode.ErrOwnerInUse
	// ErrTableNotFound is returned for a table name that does not exist.
	ErrTableNotFound = storenode.ErrTableNotFound
	// ErrTableExists is returned by CreateTable for a name already in use (open it with
	// DB.Table instead).
	ErrTableExists = storenode.ErrTableExists
	// ErrCacheFull is returned when the page cache has no evictable frame within
	// Options.CacheWait: every frame is pinned, dirty or in flight.
	ErrCacheFull = errors.New("txnode: page cache full")
	// ErrPinBudget is returned by Table.Pin when the table's pages would take what the table
	// pins hold past Options.PinBytes.
	ErrPinBudget = errors.New("txnode: pin budget exceeded")
	// ErrUnknownOutcome is returned when the context ended after the commit batch was sent,
	// when the storage node's WAL write or fsync failed for the batch (it may survive a
	// restart), or when a resent batch was older than the storage node's dedup window: the
	// transaction may or may not be durable. Retrying it is safe only if it is idempotent for
	// the game (e.g. Put of the same row).
	ErrUnknownOutcome = errors.New("txnode: commit outcome unknown")
	// ErrUnavailable is returned while the storage node has been unreachable for longer than
	// Options.RequestTimeout (a shorter outage is waited out, within each call's context):
	// reads that miss the cache, commits (refused before anything is applied) and every
	// other request fail with it at once, without waiting. It is not for good: the node
	// redials for as long as it is open, and serves again once the storage node is back. A
	// commit whose batch was in flight when the storage node was lost gets ErrUnknownOutcome
	// wrapping it instead (the batch is sent again on reconnect, and may be applied then).
	ErrUnavailable = errors.New("txnode: storage node unavailable")
	// ErrLeaseExpired is returned when this node could not renew its ownership of a table in
	// time (an outage of the storage node, say): it stops serving the table, reads included,
	// until a renewal succeeds (once the storage node is back: at once). When the
	// store refused the renewal (ErrFenced: the table was granted since, or a restored backup
	// bumped its epoch; ErrTableNotFound: the store has no such table) none ever will: close
	// and reopen the DB to acquire the table anew.
	ErrLeaseExpired = errors.New("txnode: table ownership lease expired")
	// ErrReadOnly is returned for a write inside View.
	ErrReadOnly = errors.New("txnode: write in a read-only transaction")
	// ErrTxDone is returned for a call on a committed or rolled back Tx.
	ErrTxDone = errors.New("txnode: transaction already finished")
	// ErrFenced is returned when the storage node refused a table's write because this
	// node's ownership of it is over (another node was granted it since, or a restored
	// backup bumped its epoch): reopen the DB to acquire it anew.
	ErrFenced = storenode.ErrFenced
	// ErrMoved is returned for a table (a cluster partition) frozen for a move, or moved to
	// another storage node: it matches ErrFenced; retry once the move is switched.
	ErrMoved = storenode.ErrMoved
	// ErrTxnBusy is returned when the storage node holds too many transactions in doubt (or
	// this owner's share of them): back off and retry.
	ErrTxnBusy = storenode.ErrTxnBusy
	// ErrTxnLocked is returned by txncoord.Prepare (and fails a commit batch) when the storage
	// node holds a row of the batch locked for another prepared transaction. Retryable once
	// that transaction is decided.
	ErrTxnLocked = storenode.ErrTxnLocked
	// ErrTxnDecided is returned when a transaction's recorded decision is not the one asked
	// (txncoord.DecideTxn of commit after a resolver recorded abort: the transaction aborted).
	ErrTxnDecided = storenode.ErrTxnDecided
	// ErrBadName is returned by CreateTable and Table for a name outside 1..64 bytes of
	// [A-Za-z0-9_.-].
	ErrBadName = storenode.ErrBadName
	// ErrLocked is returned by Open when another process holds Dir; ErrAlreadyOpen (this
	// process holds it: Close the other DB first) matches it too.
	ErrLocked      = storenode.ErrLocked
	ErrAlreadyOpen = storenode.ErrAlreadyOpen
	// ErrOldFormat is returned by Open for a Dir an older build wrote in a format this one does
	// not read.
	ErrOldFormat = storenode.ErrOldFormat
	// ErrFailStop is returned by every call after the storage engine stopped on a failed
	// write or sync (a full or failing disk): reopen the DB (embedded) or restart the storage
	// node; nothing acknowledged is lost.
	ErrFailStop = storenode.ErrFailStop
	// ErrTooManyTables is returned by CreateTable when the embedded store holds its most tables
	// (a storage node over TCP answers it as ErrBusy).
	ErrTooManyTables = storenode.ErrTooManyTables
	// ErrBusy is matched by a refusal at one of the storage node's limits, to retry later:
	// ErrTooManyTables and ErrTxnBusy as a storage node over TCP answers them, and its other
	// bounds (a grant it could not verify in etcd yet, its requests in flight).
	ErrBusy = base.ErrBusy
	// ErrCorruption is matched by every checksum or format failure the store reports (a page
	// or WAL record on disk, a frame on the wire): the row is never returned as data.
	ErrCorruption = corrupt.ErrCorruption
)

// The storage node's sentinels this package checks for but does not re-export: the same
// values, so errors.Is matches them for both stores, and the engine is imported only here and
// where the embedded store is opened (embedded.go).
var (
	// errSeqGap is the storage node's refusal of a batch that waited too long for the batches
	// before it in seq order: the batch was not applied.
	errSeqGap = storenode.ErrSeqGap
	// errMalformed is the storage node's refusal of a request that breaks the protocol's rules.
	errMalformed = storenode.ErrMalformed
	// errBatchTooLarge is the storage node's refusal of a batch touching too many pages.
	errBatchTooLarge = storenode.ErrBatchTooLarge
	// errStoreUnknownOutcome is the storage node's unknown outcome of a batch (commitError
	// maps it to ErrUnknownOutcome).
	errStoreUnknownOutcome = storenode.ErrUnknownOutcome
	// errEngineClosed is the embedded engine's error after its Close.
	errEngineClosed = storenode.ErrClosed
)

// commitError maps a store's commit error: an unknown outcome at the storage node (a failed
// WAL write or fsync, a seq beyond the dedup window) is this package's ErrUnknownOutcome.
func commitError(err error) error {
	if err != nil && errors.Is(err, errStoreUnknownOutcome) && !errors.Is(err, ErrUnknownOutcome) {
		return fmt.Errorf("%w: %w", ErrUnknownOutcome, err)
	}
	return err
}

// prepareLostError is Prepare's error when the prepare's answer never came (the context
// ended after it was sent, the connection failed, the storage node's WAL failed): the
// prepare may have landed, so the part must be aborted, never committed. It matches
// ErrUnknownOutcome (the prepare's outcome, not a commit's) and the cause, but does not read
// "commit outcome unknown": the coordinator that aborts knows the transaction aborted.
type prepareLostError struct {
	id    [16]byte
	cause error
}

func (e *prepareLostError) Error() string {
	return fmt.Sprintf("txnode: prepare of transaction %x: its answer was lost (it may have landed: abort it, never commit): %v", e.id, e.cause)
}

// Unwrap makes errors.Is(err, ErrUnknownOutcome) hold, and errors.Is of the cause.
func (e *prepareLostError) Unwrap() []error { return []error{ErrUnknownOutcome, e.cause} }

// errCacheBusy stops a transaction that needs a frame while the cache is full and it holds
// others (it must not wait holding them); its retry loop rolls it back and waits for room.
// It is ErrCacheFull to a caller that sees it.
var errCacheBusy = fmt.Errorf("%w: a transaction holding pages found no frame", ErrCacheFull)

// errWorkingSet is ErrCacheFull for a transaction that holds as many frames as the cache can
// ever hold and needs one more: returned at once, since waiting cannot help.
var errWorkingSet = fmt.Errorf("%w: the working set does not fit", ErrCacheFull)
