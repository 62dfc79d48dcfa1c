package bench

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRNGBelow(t *testing.T) {
	r := newRNG(1)
	var counts [10]int
	for range 100_000 {
		v := r.below(10)
		require.Less(t, v, uint64(10))
		counts[v]++
	}
	for i, c := range counts {
		require.InDelta(t, 10_000, c, 1_000, "value %d", i)
	}
	for range 1000 {
		f := r.float()
		require.True(t, f >= 0 && f < 1)
	}
}

// TestZipfSkew checks the shape: rank 0 is the most frequent, the top 1% of ranks takes a
// large share, every rank is in range, and scrambling keeps values in range.
func TestZipfSkew(t *testing.T) {
	const n = 100_000
	z := newZipf(n, zipfTheta)
	r := newRNG(7)
	counts := make([]int, n)
	const draws = 200_000
	for range draws {
		k := z.rank(&r)
		require.Less(t, k, uint64(n))
		counts[k]++
	}
	for k := 1; k < 100; k++ {
		require.GreaterOrEqual(t, counts[0], counts[k], "rank %d", k)
	}
	top := 0
	for k := range n / 100 {
		top += counts[k]
	}
	require.Greater(t, top, draws/2, "the hottest 1%% of rows take most of the draws")
	for range 10_000 {
		require.Less(t, z.scrambled(&r), uint64(n))
	}
}
