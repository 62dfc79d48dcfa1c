package sgio

import (
	"unicode/utf8"

	"github.com/weftdb/weft/base"
)

// Code is an error code carried by an Error reply (base.Code): each code maps to one sentinel
// error that both sides use (Code.Err), so errors.Is works across TCP.
type Code = base.Code

// Error codes (base's). Part of the format; do not change.
const (
	CodeCorruption     = base.CodeCorruption
	CodeMalformed      = base.CodeMalformed
	CodeUnsupported    = base.CodeUnsupported
	CodeAuthFailed     = base.CodeAuthFailed
	CodeTableNotFound  = base.CodeTableNotFound
	CodeTableExists    = base.CodeTableExists
	CodeBadName        = base.CodeBadName
	CodeBadRowSize     = base.CodeBadRowSize
	CodeOwned          = base.CodeOwned
	CodeFenced         = base.CodeFenced
	CodeSeqGap         = base.CodeSeqGap
	CodeNoSpace        = base.CodeNoSpace
	CodeFailStop       = base.CodeFailStop
	CodeFrameTooLarge  = base.CodeFrameTooLarge
	CodeBusy           = base.CodeBusy
	CodeShuttingDown   = base.CodeShuttingDown
	CodeUnknownOutcome = base.CodeUnknownOutcome
	CodeConnClosed     = base.CodeConnClosed
	CodeInternal       = base.CodeInternal
	CodeOwnerInUse     = base.CodeOwnerInUse
	CodeTxnLocked      = base.CodeTxnLocked
	CodeTxnDecided     = base.CodeTxnDecided
	CodeIdentityLost   = base.CodeIdentityLost
	CodeForbidden      = base.CodeForbidden
	CodeTxnBusy        = base.CodeTxnBusy
	CodeMoved          = base.CodeMoved
	CodeMoveLost       = base.CodeMoveLost
)

// CodeOf reports the code that carries err across the wire (base.CodeOf).
func CodeOf(err error) Code { return base.CodeOf(err) }

// RemoteError is the error a receiver of an Error reply gets (ErrorFromWire): it matches the
// code's sentinel under errors.Is and reads as the sender's message.
type RemoteError struct {
	// Code is the code as received, even one this side does not know.
	Code Code
	// Message is the sender's message text, at most ErrorMessageMax bytes.
	Message string
}

// Error reports the sender's message, or the sentinel's when the message is empty.
func (e *RemoteError) Error() string {
	if e.Message == "" {
		return e.Code.String()
	}
	return e.Message
}

// Unwrap reports the code's sentinel, so errors.Is(err, sgio.ErrTableNotFound) holds.
func (e *RemoteError) Unwrap() error { return e.Code.Err() }

// ErrorFromWire reports the error an Error reply {code, msg} stands for: a *RemoteError that
// matches code's sentinel (ErrInternal for an unknown code) and reads as msg.
func ErrorFromWire(code Code, msg string) error { return &RemoteError{Code: code, Message: msg} }

// NewErrorReply reports the Error reply that carries err: CodeOf(err) and err's text, cut to
// ErrorMessageMax bytes on a UTF-8 boundary. A server calls it for a failed request.
func NewErrorReply(err error) *ErrorReply {
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if len(msg) > ErrorMessageMax {
		cut := ErrorMessageMax
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = msg[:cut]
	}
	return &ErrorReply{Code: CodeOf(err), Message: msg}
}
