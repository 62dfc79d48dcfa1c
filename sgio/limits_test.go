package sgio

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/logicpage"
)

// TestLimitsAreLogicpages ties the wire protocol's page geometry to logicpage's, its one
// definition: the constants and the row size check agree for every size around the bounds.
func TestLimitsAreLogicpages(t *testing.T) {
	require.EqualValues(t, logicpage.RowsPerPage, RowsPerPage)
	require.EqualValues(t, logicpage.PageMax, PageMax)
	require.EqualValues(t, logicpage.TablePagesMax, TablePagesMax)
	require.EqualValues(t, logicpage.RowBytesMin, RowBytesMin)
	require.EqualValues(t, logicpage.RowBytesMax, RowBytesMax)
	require.Less(t, uint64(TablePagesMax), uint64(PageMax))
	for n := -8; n <= RowBytesMax+64; n++ {
		_, geoErr := logicpage.NewGeometry(n)
		wireErr := CheckRowBytes(n)
		require.Equal(t, geoErr == nil, wireErr == nil, "row size %d: logicpage %v, sgio %v", n, geoErr, wireErr)
		require.True(t, wireErr == nil || errors.Is(wireErr, ErrBadRowSize))
	}
}
