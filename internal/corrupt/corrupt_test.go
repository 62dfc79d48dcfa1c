package corrupt

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestErrorfWrapsMarkerAndCause(t *testing.T) {
	err := Errorf("wal: record at offset %d: %w", 4096, io.ErrUnexpectedEOF)
	require.ErrorIs(t, err, ErrCorruption)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	require.Equal(t, "wal: record at offset 4096: unexpected EOF", err.Error())

	wrapped := fmt.Errorf("storenode: open: %w", err)
	require.ErrorIs(t, wrapped, ErrCorruption)
	require.False(t, errors.Is(errors.New("other"), ErrCorruption))
}
