package logicpage

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/corrupt"
)

func TestErrorsArePrefixedAndDistinct(t *testing.T) {
	sentinels := []error{ErrRowSize, ErrSegment}
	for i, err := range sentinels {
		require.True(t, strings.HasPrefix(err.Error(), "logicpage: "), err.Error())
		for j, other := range sentinels {
			require.Equal(t, i == j, errors.Is(err, other), "%v vs %v", err, other)
		}
	}
}

func TestErrorsWrapping(t *testing.T) {
	_, err := NewGeometry(7)
	require.ErrorIs(t, err, ErrRowSize)
	require.False(t, errors.Is(err, corrupt.ErrCorruption), "a bad row size is a bad argument, not corruption")
	require.Equal(t, "logicpage: bad row size 7: want a multiple of 8 in 8..4096", err.Error())

	g := mustGeometry(t, 64)
	err = g.CheckSegment(base.Segment{Page: 3, Data: 1, Clear: 1, Rows: make([]byte, 64)})
	require.ErrorIs(t, err, ErrSegment)
	require.ErrorIs(t, err, corrupt.ErrCorruption)
	require.True(t, strings.HasPrefix(err.Error(), "logicpage: bad segment: page 3: "), err.Error())
}
