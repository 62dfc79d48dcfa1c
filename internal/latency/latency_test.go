package latency

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestBucketBounds(t *testing.T) {
	for _, c := range []struct {
		d      time.Duration
		bucket int
	}{
		{0, 0}, {-time.Second, 0}, {time.Nanosecond, 0}, {time.Microsecond, 0},
		{time.Microsecond + 1, 1}, {2 * time.Microsecond, 1}, {3 * time.Microsecond, 2},
		{time.Millisecond, 10}, {time.Second, 20}, {time.Hour, Buckets - 1},
	} {
		require.Equal(t, c.bucket, bucketOf(c.d), "%v", c.d)
		require.LessOrEqual(t, c.d, Bound(bucketOf(c.d)), "%v within its bucket's bound", c.d)
		if b := bucketOf(c.d); b > 0 {
			require.Greater(t, c.d, Bound(b-1), "%v above the previous bound", c.d)
		}
	}
	require.Equal(t, time.Duration(math.MaxInt64), Bound(Buckets-1))
}

func TestQuantiles(t *testing.T) {
	var h Histogram
	s := h.Snapshot()
	require.Zero(t, s.Quantile(0.99), "nothing recorded")
	for range 99 {
		h.Observe(100 * time.Microsecond)
	}
	h.Observe(50 * time.Millisecond)
	s = h.Snapshot()
	require.Equal(t, uint64(100), s.Count())
	require.Equal(t, 99*100*time.Microsecond+50*time.Millisecond, s.Sum)
	require.Equal(t, 128*time.Microsecond, s.Quantile(0.5))
	require.Equal(t, 128*time.Microsecond, s.Quantile(0.99))
	require.Equal(t, 65536*time.Microsecond, s.Quantile(1))
}

func TestObserveAllocatesNothing(t *testing.T) {
	var h Histogram
	start := time.Now()
	require.Zero(t, testing.AllocsPerRun(1000, func() { h.Observe(3 * time.Millisecond); h.Since(start) }))
}
