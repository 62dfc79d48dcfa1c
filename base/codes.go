package base

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/weftdb/weft/internal/corrupt"
)

// Code is an error code carried by an Error reply. Each code maps to one sentinel error that
// both sides use (Code.Err), so errors.Is works across TCP.
type Code uint16

// Error codes. Part of the format; do not change. 0 is not a code.
const (
	CodeCorruption     Code = 1  // corrupt.ErrCorruption: bad bytes on disk or on the wire
	CodeMalformed      Code = 2  // ErrMalformed: a request breaks the format's rules
	CodeUnsupported    Code = 3  // ErrUnsupported: unknown protocol version or message type
	CodeAuthFailed     Code = 4  // ErrAuthFailed
	CodeTableNotFound  Code = 5  // ErrTableNotFound
	CodeTableExists    Code = 6  // ErrTableExists
	CodeBadName        Code = 7  // ErrBadName
	CodeBadRowSize     Code = 8  // ErrBadRowSize
	CodeOwned          Code = 9  // ErrOwned: another owner's lease is live
	CodeFenced         Code = 10 // ErrFenced: stale epoch or not the owner
	CodeSeqGap         Code = 11 // ErrSeqGap
	CodeNoSpace        Code = 12 // ErrNoSpace (syscall.ENOSPC)
	CodeFailStop       Code = 13 // ErrFailStop
	CodeFrameTooLarge  Code = 14 // ErrFrameTooLarge
	CodeBusy           Code = 15 // ErrBusy: a limit was reached
	CodeShuttingDown   Code = 16 // ErrShuttingDown
	CodeUnknownOutcome Code = 17 // ErrUnknownOutcome
	CodeConnClosed     Code = 18 // ErrConnClosed
	CodeInternal       Code = 19 // ErrInternal: anything else
	CodeOwnerInUse     Code = 20 // ErrOwnerInUse: another incarnation holds the owner id
	CodeTxnLocked      Code = 21 // ErrTxnLocked: rows held by a prepared transaction
	CodeTxnDecided     Code = 22 // ErrTxnDecided: another decision is recorded
	CodeIdentityLost   Code = 23 // ErrIdentityLost: this connection no longer holds its owner id
	CodeForbidden      Code = 24 // ErrForbidden: a request outside the caller's role
	CodeTxnBusy        Code = 25 // ErrTxnBusy: too many transactions in doubt (matches ErrBusy)
	// Partition moves (docs/cluster.md, "Moving a partition"): 40.. (a range of their own).
	CodeMoved    Code = 40 // ErrMoved: the partition's copy is moving or moved away
	CodeMoveLost Code = 41 // ErrMoveLost: a move's mark is gone (the source restarted)
)

// codeTable maps codes to sentinels. CodeOf walks it in order, so a code whose sentinel wraps
// another's (ErrMalformed wraps corrupt.ErrCorruption) comes before it, and the catch-alls come
// last.
var codeTable = [...]struct {
	code Code
	err  error
}{
	{CodeAuthFailed, ErrAuthFailed},
	{CodeTableNotFound, ErrTableNotFound},
	{CodeTableExists, ErrTableExists},
	{CodeBadName, ErrBadName},
	{CodeBadRowSize, ErrBadRowSize},
	{CodeOwned, ErrOwned},
	{CodeOwnerInUse, ErrOwnerInUse},
	{CodeIdentityLost, ErrIdentityLost},
	{CodeForbidden, ErrForbidden},
	{CodeMoved, ErrMoved}, // before ErrFenced, which it wraps
	{CodeMoveLost, ErrMoveLost},
	{CodeFenced, ErrFenced},
	{CodeSeqGap, ErrSeqGap},
	{CodeTxnLocked, ErrTxnLocked},
	{CodeTxnDecided, ErrTxnDecided},
	{CodeUnknownOutcome, ErrUnknownOutcome}, // before the causes it may wrap (fail-stop, ENOSPC)
	{CodeNoSpace, ErrNoSpace},
	{CodeFailStop, ErrFailStop},
	{CodeFrameTooLarge, ErrFrameTooLarge},
	{CodeTxnBusy, ErrTxnBusy}, // before ErrBusy, which it wraps
	{CodeBusy, ErrBusy},
	{CodeShuttingDown, ErrShuttingDown},
	{CodeConnClosed, ErrConnClosed},
	{CodeUnsupported, ErrUnsupported},
	{CodeMalformed, ErrMalformed},
	{CodeCorruption, corrupt.ErrCorruption},
	{CodeInternal, ErrInternal},
}

// Err reports the sentinel of c; a code this side does not know maps to ErrInternal.
func (c Code) Err() error {
	for _, e := range codeTable {
		if e.code == c {
			return e.err
		}
	}
	return ErrInternal
}

// String reports the sentinel's message, or the number of a code this side does not know.
func (c Code) String() string {
	for _, e := range codeTable {
		if e.code == c {
			return e.err.Error()
		}
	}
	return fmt.Sprintf("sgio: error code %d", uint16(c))
}

// CodeOf reports the code that carries err across the wire: the first code whose sentinel err
// matches under errors.Is, CodeNoSpace for any error matching syscall.ENOSPC, CodeInternal for
// anything else (nil included: a caller sends an Error reply only for a failure).
func CodeOf(err error) Code {
	if err == nil {
		return CodeInternal
	}
	for _, e := range codeTable {
		if errors.Is(err, e.err) {
			return e.code
		}
	}
	if errors.Is(err, syscall.ENOSPC) {
		return CodeNoSpace
	}
	return CodeInternal
}
