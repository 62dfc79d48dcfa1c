package assert

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestThat(t *testing.T) {
	require.NotPanics(t, func() { That(true, "never") })
	require.PanicsWithValue(t, "weft: invariant violated: queue bound 3 > 2", func() { That(false, "queue bound %d > %d", 3, 2) })
}
