package base

import (
	"syscall"

	"github.com/weftdb/weft/internal/assert"
	"github.com/weftdb/weft/internal/corrupt"
)

// Errors that cross the wire, grouped by when they occur. Each has one Code (codes.go), and
// both sides use the same sentinel, so errors.Is holds for an error that came over TCP. They
// read "sgio: ..." as they did when the wire package defined them (a remote error with no text
// reads as its sentinel). Format and checksum failures wrap corrupt.ErrCorruption.
var (
	// Decoding a frame.

	// ErrFrameTooLarge is returned for a frame whose body exceeds the receiver's limit, and by
	// the client, before sending, for a request larger than the server accepts.
	ErrFrameTooLarge = newCodeSentinel(CodeFrameTooLarge, "sgio: frame too large")
	// ErrUnsupported is returned for a protocol version or message type this side does not
	// speak.
	ErrUnsupported = newCodeSentinel(CodeUnsupported, "sgio: unsupported protocol version or message type")

	// Parsing a body, and checking a message before it is sent.

	// ErrMalformed is returned for a frame or body that breaks the format's rules (reserved
	// fields not zero, counts beyond the body, overlapping masks, trailing bytes).
	ErrMalformed = newCodeSentinel(CodeMalformed, "sgio: malformed message", corrupt.ErrCorruption)
	// ErrTruncated is returned for a body shorter than its own fields say (a count beyond the
	// bytes left, rows cut short). It has no code of its own: it crosses the wire as
	// ErrMalformed, its parent.
	ErrTruncated = NewPlainSentinel("sgio: truncated message", ErrMalformed)
	// ErrBadName is returned for a table or stat name outside 1..NameMax bytes of
	// [A-Za-z0-9_.-], or a client name that is neither empty nor such a name.
	ErrBadName = newCodeSentinel(CodeBadName, "sgio: bad name")
	// ErrBadRowSize is returned for a row size outside RowBytesMin..RowBytesMax or not a
	// multiple of 8, and for rows whose size does not match their table's.
	ErrBadRowSize = newCodeSentinel(CodeBadRowSize, "sgio: bad row size")

	// Handshake.

	// ErrAuthFailed is returned when either side fails to prove knowledge of the shared
	// secret.
	ErrAuthFailed = newCodeSentinel(CodeAuthFailed, "sgio: authentication failed")
	// ErrForbidden is returned for a request outside the role of the credential the caller
	// authenticated with (client, peer or operator: docs/operations.md, "Roles and
	// credentials"): it was refused before it touched anything.
	ErrForbidden = newCodeSentinel(CodeForbidden, "sgio: request outside the caller's role")

	// Catalog.

	// ErrTableNotFound is returned for a table name or id that does not exist.
	ErrTableNotFound = newCodeSentinel(CodeTableNotFound, "sgio: table not found")
	// ErrTableExists is returned by CreateTable for a name already in use.
	ErrTableExists = newCodeSentinel(CodeTableExists, "sgio: table exists")

	// Ownership and ordering.

	// ErrOwned is returned by Acquire while another owner holds a live lease on the table.
	ErrOwned = newCodeSentinel(CodeOwned, "sgio: table owned by another transaction node")
	// ErrFenced is returned for a commit or id grant whose owner or epoch is not the table's
	// current grant.
	ErrFenced = newCodeSentinel(CodeFenced, "sgio: fenced: stale epoch or not the owner")
	// ErrOwnerInUse is returned by the handshake for an owner id that another live
	// incarnation (another process, or an earlier Open) holds: it has not released it and has
	// not been silent for a lease.
	ErrOwnerInUse = newCodeSentinel(CodeOwnerInUse, "sgio: owner id in use by another live incarnation")
	// ErrIdentityLost is returned for a request acting as the owner on a connection that no
	// longer holds its owner id: a later connection of the owner claimed it (a reconnect of the
	// same incarnation, or another incarnation after a lease of silence), or the owner released
	// it. It says nothing about the owner's grants (it is not ErrFenced): the request was not
	// executed, and the connection is on its way out; send it again on a connection that holds
	// the id.
	ErrIdentityLost = newCodeSentinel(CodeIdentityLost, "sgio: this connection no longer holds its owner id")
	// ErrSeqGap is returned when an owner's batch waited too long for the batches before it in
	// seq order.
	ErrSeqGap = newCodeSentinel(CodeSeqGap, "sgio: gap in owner's batch sequence")

	// Two-phase commit.

	// ErrTxnLocked is returned for a commit or prepare that touches a row of a prepared
	// transaction not yet decided, and for a drop of a table such a transaction writes.
	ErrTxnLocked = newCodeSentinel(CodeTxnLocked, "sgio: rows locked by a prepared transaction")
	// ErrTxnDecided is returned when a transaction's recorded decision is not the one asked
	// for (a late commit after a resolver's abort); the message names the recorded decision.
	ErrTxnDecided = newCodeSentinel(CodeTxnDecided, "sgio: transaction already decided otherwise")

	// Partition moves.

	// ErrMoved is returned for a grant, commit or read of a partition table whose copy is
	// frozen for a move, incoming (being filled) or retired (moved away): the caller reads
	// the partition map again and goes to the storage node it names. It matches ErrFenced:
	// the owner's grant is over at this storage node (a move's switch keeps the owner key:
	// the owner registers the same grant with the new copy once it is live).
	ErrMoved = newCodeSentinel(CodeMoved, "sgio: partition moving or moved to another storage node", ErrFenced)
	// ErrMoveLost is returned when a move's mark of changed pages is gone (the source
	// restarted, or a newer mark replaced it): the mover copies the whole table again.
	ErrMoveLost = newCodeSentinel(CodeMoveLost, "sgio: partition move's change mark lost")

	// Storage node state.

	// ErrNoSpace is returned when the storage node's disk is full; it also matches
	// syscall.ENOSPC.
	ErrNoSpace = newCodeSentinel(CodeNoSpace, "sgio: no space left on the storage node", syscall.ENOSPC)
	// ErrFailStop is returned once the storage node stopped accepting commits after an IO
	// error; it accepts them again only after a restart.
	ErrFailStop = newCodeSentinel(CodeFailStop, "sgio: storage node stopped after an IO failure")
	// ErrBusy is returned when a limit is reached: the in-flight bound of a connection (the
	// wait for a free slot ended with the caller's context), or a server-side bound.
	ErrBusy = newCodeSentinel(CodeBusy, "sgio: busy")
	// ErrTxnBusy is returned when a storage node holds as many transactions in doubt
	// (prepared parts, kept decisions) as it may: a two-phase commit to retry later. It
	// matches ErrBusy (a peer that does not know the code reads it as Internal).
	ErrTxnBusy = newCodeSentinel(CodeTxnBusy, "sgio: too many transactions in doubt", ErrBusy)
	// ErrShuttingDown is returned by a server that is closing.
	ErrShuttingDown = newCodeSentinel(CodeShuttingDown, "sgio: shutting down")
	// ErrInternal is returned for a failure with no more specific code, and for error codes
	// this side does not know.
	ErrInternal = newCodeSentinel(CodeInternal, "sgio: internal error")

	// Connection.

	// ErrUnknownOutcome is wrapped by the error of a request whose context ended, or whose
	// connection failed, after the request was handed to the socket: the server may or may not
	// have executed it. Retrying is safe: commits carry (owner, seq) and are applied once.
	ErrUnknownOutcome = newCodeSentinel(CodeUnknownOutcome, "sgio: request sent, outcome unknown")
	// ErrConnClosed is wrapped, together with the cause, by the error of every request on a
	// connection that broke or was closed.
	ErrConnClosed = newCodeSentinel(CodeConnClosed, "sgio: connection closed")
)

// sentinel is an error with a fixed message that also matches its parents under errors.Is: a
// corruption sentinel matches corrupt.ErrCorruption, ErrNoSpace matches syscall.ENOSPC. A
// sentinel with a code (every one in codeTable, and a twin from NewSentinel) also
// matches every other sentinel of the same code, both ways: that is how a storage engine's
// own sentinel (storenode.ErrFenced, reading "storenode: ...") and the wire's (ErrFenced, which
// an error that crossed TCP unwraps to) are one error under errors.Is.
type sentinel struct {
	msg     string
	code    Code
	parents []error
}

// NewPlainSentinel returns a sentinel error with no code of its own that reads as msg and
// matches parents under errors.Is (ErrTruncated, which matches ErrMalformed).
func NewPlainSentinel(msg string, parents ...error) error {
	return &sentinel{msg: msg, parents: parents}
}

func newCodeSentinel(code Code, msg string, parents ...error) error {
	return &sentinel{msg: msg, code: code, parents: parents}
}

// NewSentinel returns a sentinel error for another package's errors.go that stands for code:
// it reads as msg (that package's own prefix and words) and, under errors.Is, matches code's
// sentinel here (so CodeOf carries it as code) and is matched by it (so the error a client
// gets over TCP, a RemoteError of code, matches it too). Use it only for an error that means
// exactly what code means; a narrower error (one of several reasons for ErrBusy, say) wraps
// the wire's sentinel instead, so the wire's coarser error does not match it. It panics for a
// code whose sentinel is not this package's (CodeCorruption: wrap corrupt.ErrCorruption
// instead) or that this side does not know: no error over TCP would match such a twin.
func NewSentinel(code Code, msg string) error {
	wire, ok := code.Err().(*sentinel)
	if !ok || wire.code != code {
		assert.Failf("base: NewSentinel(%d, %q): code %d has no sentinel of this package", uint16(code), msg, uint16(code))
	}
	return &sentinel{msg: msg, code: code, parents: []error{wire}}
}

// Error reports the sentinel's message.
func (e *sentinel) Error() string { return e.msg }

// Unwrap reports the parents, so errors.Is finds them.
func (e *sentinel) Unwrap() []error { return e.parents }

// Is reports whether target is a sentinel of the same code.
func (e *sentinel) Is(target error) bool {
	t, ok := target.(*sentinel)
	return ok && e.code != 0 && t.code == e.code
}

// CodeSentinel is one entry of Codes: a code and its sentinel.
type CodeSentinel struct {
	Code Code
	Err  error
}

// Codes reports every code with its sentinel, in the order CodeOf tries them; the slice is
// the caller's.
func Codes() []CodeSentinel {
	out := make([]CodeSentinel, 0, len(codeTable))
	for _, e := range codeTable {
		out = append(out, CodeSentinel{Code: e.code, Err: e.err})
	}
	return out
}
