package assert

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestThat(t *testing.T) {
	require.NotPanics(t, func() { That(true, "never") })
	require.PanicsWithValue(t, "weft: invariant violated: queue over its bound", func() { That(false, "queue over its bound") })
	require.PanicsWithValue(t, "weft: invariant violated: queue bound 3 > 2", func() { Failf("queue bound %d > %d", 3, 2) })
}

// TestHoldingAssertionDoesNotAllocate guards the hot-path contract: a holding That, and the
// Failf-behind-the-branch pattern with values that would box (beyond the runtime's cached small
// integers, an error, a string), cost no allocation.
func TestHoldingAssertionDoesNotAllocate(t *testing.T) {
	big, want := uint64(1<<40), uint64(1<<40)
	var err error
	s := "table"
	allocs := testing.AllocsPerRun(1000, func() {
		That(big == want, "values differ")
		if big != want || err != nil {
			Failf("%s: got %d, want %d: %v", s, big, want, err)
		}
		big++
		want++
	})
	require.Zero(t, allocs)
}
