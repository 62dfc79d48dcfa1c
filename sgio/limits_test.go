package sgio

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/logicpage"
)

// TestLimitsAreLogicpages ties the wire protocol's page geometry to logicpage's, its one
// definition (the row size check's agreement is commitbody's TestRowBytesAreLogicpages).
func TestLimitsAreLogicpages(t *testing.T) {
	require.EqualValues(t, logicpage.RowsPerPage, RowsPerPage)
	require.EqualValues(t, logicpage.PageMax, PageMax)
	require.EqualValues(t, logicpage.TablePagesMax, TablePagesMax)
	require.EqualValues(t, logicpage.RowBytesMin, RowBytesMin)
	require.EqualValues(t, logicpage.RowBytesMax, RowBytesMax)
	require.Less(t, uint64(TablePagesMax), uint64(PageMax))
}
