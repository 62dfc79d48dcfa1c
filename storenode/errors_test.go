package storenode

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/sgio"
)

// TestErrorsReadAsStorenode: every sentinel of the engine reads "storenode: ..." and nothing of
// the wire's words (an embedded game never sees "sgio: fenced"), while errors.Is still ties it
// to its wire code: a twin matches the wire's sentinel both ways and the error that crosses TCP
// (CodeOf, then ErrorFromWire) matches the twin; a narrower error matches its wire sentinel
// but the wire's coarser error does not match it.
func TestErrorsReadAsStorenode(t *testing.T) {
	twins := []struct {
		err, wire error
	}{
		{ErrTableNotFound, sgio.ErrTableNotFound}, {ErrTableExists, sgio.ErrTableExists},
		{ErrBadName, sgio.ErrBadName}, {ErrRowSize, sgio.ErrBadRowSize}, {ErrTableOwned, sgio.ErrOwned},
		{ErrOwnerInUse, sgio.ErrOwnerInUse}, {ErrFenced, sgio.ErrFenced}, {ErrSeqGap, sgio.ErrSeqGap},
		{ErrMalformed, sgio.ErrMalformed}, {ErrFailStop, sgio.ErrFailStop},
		{ErrUnknownOutcome, sgio.ErrUnknownOutcome},
	}
	narrow := []struct {
		err, wire error
	}{
		{ErrTooManyTables, sgio.ErrBusy}, {ErrSeqReused, sgio.ErrFenced}, {ErrBatchTooLarge, sgio.ErrFrameTooLarge},
		{ErrClosed, sgio.ErrShuttingDown},
	}
	all := []error{ErrLocked, ErrAlreadyOpen, ErrOldFormat}
	for _, c := range twins {
		all = append(all, c.err)
		wrapped := fmt.Errorf("storenode: table 7: %w", c.err)
		require.ErrorIs(t, wrapped, c.wire, c.err.Error())
		require.ErrorIs(t, fmt.Errorf("sgio: x: %w", c.wire), c.err, "the wire's sentinel matches its twin: %v", c.err)
		code := sgio.CodeOf(wrapped)
		require.Equal(t, sgio.CodeOf(c.wire), code, c.err.Error())
		remote := fmt.Errorf("txnode: over TCP: %w", sgio.ErrorFromWire(code, wrapped.Error()))
		require.ErrorIs(t, remote, c.err, "errors.Is across TCP: %v", c.err)
		require.ErrorIs(t, remote, c.wire)
	}
	for _, c := range narrow {
		all = append(all, c.err)
		require.ErrorIs(t, c.err, c.wire, c.err.Error())
		require.False(t, errors.Is(c.wire, c.err), "the wire's coarser %v does not match %v", c.wire, c.err)
		require.Equal(t, sgio.CodeOf(c.wire), sgio.CodeOf(c.err), c.err.Error())
	}
	require.ErrorIs(t, ErrSeqReused, ErrFenced)
	require.False(t, errors.Is(ErrFenced, ErrSeqReused))
	require.False(t, errors.Is(ErrFenced, ErrTableOwned), "twins of two codes stay apart")
	require.False(t, errors.Is(sgio.ErrOwned, ErrFenced))
	for _, err := range all {
		require.True(t, strings.HasPrefix(err.Error(), "storenode: "), err.Error())
		require.NotContains(t, err.Error(), "sgio", err.Error())
	}
}
