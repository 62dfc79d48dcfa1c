package sgio

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/corrupt"
)

func TestSentinelsArePrefixed(t *testing.T) {
	for _, err := range []error{ErrNeedMore, ErrBadMagic, ErrChecksum, ErrFrameTooLarge, ErrUnsupported,
		ErrBadVersion, ErrUnknownType, ErrMalformed, ErrTruncated, ErrBadName, ErrBadRowSize, ErrAuthFailed,
		ErrTableNotFound, ErrTableExists, ErrOwned, ErrFenced, ErrSeqGap, ErrNoSpace, ErrFailStop, ErrBusy,
		ErrShuttingDown, ErrInternal, ErrUnknownOutcome, ErrConnClosed} {
		require.True(t, strings.HasPrefix(err.Error(), "sgio: "), err.Error())
	}
	for _, err := range []error{ErrBadMagic, ErrChecksum, ErrMalformed, ErrTruncated} {
		require.ErrorIs(t, err, corrupt.ErrCorruption, err.Error())
	}
	for _, err := range []error{ErrFrameTooLarge, ErrBadVersion, ErrUnknownType, ErrBadName, ErrBadRowSize, ErrNeedMore} {
		require.False(t, errors.Is(err, corrupt.ErrCorruption), err.Error())
	}
}

func TestSentinelParents(t *testing.T) {
	require.ErrorIs(t, ErrNoSpace, syscall.ENOSPC)
	require.ErrorIs(t, ErrTruncated, ErrMalformed)
	require.ErrorIs(t, ErrBadVersion, ErrUnsupported)
	require.ErrorIs(t, ErrUnknownType, ErrUnsupported)
	require.False(t, errors.Is(ErrMalformed, ErrTruncated))
}

// TestNewSentinel: another package's sentinel of a code reads as its own message and is one
// error with the wire's sentinel of that code under errors.Is, both ways and across the wire
// (ErrorFromWire), never with another code's.
func TestNewSentinel(t *testing.T) {
	twin := NewSentinel(CodeFenced, "engine: fenced")
	require.Equal(t, "engine: fenced", twin.Error())
	require.ErrorIs(t, twin, ErrFenced)
	require.ErrorIs(t, ErrFenced, twin)
	require.ErrorIs(t, ErrorFromWire(CodeFenced, "whatever the sender said"), twin)
	require.Equal(t, CodeFenced, CodeOf(fmt.Errorf("engine: commit: %w", twin)))
	require.False(t, errors.Is(twin, ErrOwned))
	require.False(t, errors.Is(ErrOwned, twin))
	require.False(t, errors.Is(ErrorFromWire(CodeOwned, ""), twin))
	malformed := NewSentinel(CodeMalformed, "engine: malformed")
	require.ErrorIs(t, malformed, corrupt.ErrCorruption, "the wire sentinel's parents too")
	require.ErrorIs(t, ErrTruncated, malformed, "a child of the wire's sentinel matches the twin")
}

// TestNewSentinelNeedsAWireSentinel: a twin keeps its promise (the wire's error of its code,
// and so a RemoteError of it, matches the twin) only for a code whose sentinel is one of this
// package's; for CodeCorruption (corrupt.ErrCorruption) and for a code this side does not
// know it cannot, so NewSentinel refuses them rather than hand out a twin that silently does
// not match over TCP. Fails on 36b8b47: NewSentinel made both, and neither matched.
func TestNewSentinelNeedsAWireSentinel(t *testing.T) {
	for _, code := range []Code{CodeCorruption, 0, 99} {
		require.Panics(t, func() { NewSentinel(code, "engine: x") }, "code %d", code)
	}
	for _, e := range base.Codes() {
		if e.Code == CodeCorruption {
			continue
		}
		twin := NewSentinel(e.Code, "engine: x")
		require.ErrorIs(t, ErrorFromWire(e.Code, ""), twin, "code %d over TCP", e.Code)
		require.ErrorIs(t, e.Err, twin, "code %d", e.Code)
	}
}
