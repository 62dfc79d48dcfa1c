package sgio

import (
	"errors"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

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
