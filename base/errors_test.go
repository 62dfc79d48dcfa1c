package base

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCodeTableAgrees: every sentinel in codeTable carries its own code (the one exception,
// CodeCorruption, is corrupt.ErrCorruption, not a sentinel of this package). Moved from sgio's
// TestNewSentinel with the table.
func TestCodeTableAgrees(t *testing.T) {
	for _, e := range codeTable {
		if s, ok := e.err.(*sentinel); ok {
			require.Equal(t, e.code, s.code, "codeTable and the sentinel agree: %v", e.err)
		} else {
			require.Equal(t, CodeCorruption, e.code, "every sentinel in codeTable has its code: %v", e.err)
		}
	}
}
