package sgio

import (
	"errors"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/corrupt"
)

// Errors of the protocol that never cross the wire as codes of their own, grouped by when they
// occur; those that do are base's (below). Format and checksum failures wrap
// corrupt.ErrCorruption.
var (
	// Decoding a frame.

	// ErrNeedMore is returned by Decode, unwrapped, while the buffer holds less than a whole
	// frame; Decode's n says how many bytes it needs. It is not a failure.
	ErrNeedMore = errors.New("sgio: need more bytes for a whole frame")
	// ErrBadMagic is returned for a frame that does not start with Magic.
	ErrBadMagic = base.NewPlainSentinel("sgio: bad frame magic", corrupt.ErrCorruption)
	// ErrChecksum is returned for a frame whose CRC32C does not match its bytes.
	ErrChecksum = base.NewPlainSentinel("sgio: frame checksum mismatch", corrupt.ErrCorruption)
	// ErrBadVersion is returned for a frame or Hello of another protocol version.
	ErrBadVersion = base.NewPlainSentinel("sgio: unsupported protocol version", ErrUnsupported)
	// ErrUnknownType is returned for a frame whose message type this side does not know.
	ErrUnknownType = base.NewPlainSentinel("sgio: unknown message type", ErrUnsupported)

	// Handshake.

	// ErrWeakSecret is returned, before anything is sent, for a configured secret that is not
	// hex or base64 of at least SecretBytesMin random bytes (ParseSecret).
	ErrWeakSecret = errors.New("sgio: weak or malformed secret")

	// Ownership and ordering.

	// Partition moves.

	// Connection.

)

// The errors that cross the wire are base's (the same values: errors.Is matches either name).
var (
	ErrFrameTooLarge  = base.ErrFrameTooLarge
	ErrUnsupported    = base.ErrUnsupported
	ErrMalformed      = base.ErrMalformed
	ErrTruncated      = base.ErrTruncated
	ErrBadName        = base.ErrBadName
	ErrBadRowSize     = base.ErrBadRowSize
	ErrAuthFailed     = base.ErrAuthFailed
	ErrForbidden      = base.ErrForbidden
	ErrTableNotFound  = base.ErrTableNotFound
	ErrTableExists    = base.ErrTableExists
	ErrOwned          = base.ErrOwned
	ErrFenced         = base.ErrFenced
	ErrOwnerInUse     = base.ErrOwnerInUse
	ErrIdentityLost   = base.ErrIdentityLost
	ErrSeqGap         = base.ErrSeqGap
	ErrTxnLocked      = base.ErrTxnLocked
	ErrTxnDecided     = base.ErrTxnDecided
	ErrTxnBusy        = base.ErrTxnBusy
	ErrMoved          = base.ErrMoved
	ErrMoveLost       = base.ErrMoveLost
	ErrNoSpace        = base.ErrNoSpace
	ErrFailStop       = base.ErrFailStop
	ErrBusy           = base.ErrBusy
	ErrShuttingDown   = base.ErrShuttingDown
	ErrInternal       = base.ErrInternal
	ErrUnknownOutcome = base.ErrUnknownOutcome
	ErrConnClosed     = base.ErrConnClosed
)

// NewSentinel returns a twin of code's sentinel for another package's errors.go
// (base.NewSentinel).
func NewSentinel(code Code, msg string) error { return base.NewSentinel(code, msg) }
