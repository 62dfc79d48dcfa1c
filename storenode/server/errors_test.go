package server

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/sgio"
)

// The server's sentinels read as the storage node's ("storenode: ...", nothing of the wire's
// words), as storenode's TestErrorsReadAsStorenode checks for the engine's; ErrTransportStopped
// matches the wire's ErrShuttingDown and travels as its code, but that coarser error does not
// match it.
func TestErrorsReadAsStorenode(t *testing.T) {
	require.ErrorIs(t, ErrTransportStopped, sgio.ErrShuttingDown)
	require.False(t, errors.Is(sgio.ErrShuttingDown, ErrTransportStopped))
	require.Equal(t, sgio.CodeOf(sgio.ErrShuttingDown), sgio.CodeOf(ErrTransportStopped))
	for _, err := range []error{ErrFileLimit, ErrTransportStopped} {
		require.True(t, strings.HasPrefix(err.Error(), "storenode: "), err.Error())
		require.NotContains(t, err.Error(), "sgio", err.Error())
	}
}
