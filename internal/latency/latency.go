// Package latency is a fixed-bucket latency histogram that hot paths record into without
// allocating or locking, and that a metrics scrape reads: Prometheus histograms and
// percentiles (docs/operations.md, "Metrics").
//
// Invariants:
//   - bucket i counts the durations d with 2^(i-1) µs < d <= 2^i µs (bucket 0: d <= 1 µs); the
//     last, Buckets-1, also every longer one (its bound is +Inf for Prometheus);
//   - Observe is one atomic add on a bucket and one on the sum: safe from any goroutine;
//   - a Snapshot is read bucket by bucket while others record: each count is exact, the set a
//     moment's approximation (as every scrape of live counters is).
package latency

import (
	"math"
	"math/bits"
	"sync/atomic"
	"time"
)

// Buckets is the number of buckets: the last finite bound is 2^(Buckets-2) µs, about 67 s.
const Buckets = 28

// Histogram counts durations in power-of-two microsecond buckets. The zero value is ready.
type Histogram struct {
	counts [Buckets]atomic.Uint64
	sumNs  atomic.Uint64
}

// bucketOf returns d's bucket.
func bucketOf(d time.Duration) int {
	us := uint64(max(d, 0)+time.Microsecond-1) / uint64(time.Microsecond) // rounded up
	if us <= 1 {
		return 0
	}
	return min(bits.Len64(us-1), Buckets-1)
}

// Observe records one duration. No allocation; any goroutine.
func (h *Histogram) Observe(d time.Duration) {
	h.counts[bucketOf(d)].Add(1)
	h.sumNs.Add(uint64(max(d, 0)))
}

// Since records the time since start (Observe(time.Since(start))).
func (h *Histogram) Since(start time.Time) { h.Observe(time.Since(start)) }

// Snapshot is a histogram's counts at one moment.
type Snapshot struct {
	Counts [Buckets]uint64
	Sum    time.Duration
}

// Snapshot reads the counts.
func (h *Histogram) Snapshot() Snapshot {
	var s Snapshot
	for i := range h.counts {
		s.Counts[i] = h.counts[i].Load()
	}
	s.Sum = time.Duration(h.sumNs.Load())
	return s
}

// Bound returns bucket i's upper bound (+Inf for the last, as a duration: math.MaxInt64).
func Bound(i int) time.Duration {
	if i >= Buckets-1 {
		return math.MaxInt64
	}
	return time.Duration(1<<i) * time.Microsecond
}

// Count is the number of durations recorded.
func (s Snapshot) Count() uint64 {
	var n uint64
	for _, c := range s.Counts {
		n += c
	}
	return n
}

// Quantile returns the upper bound of the bucket that holds quantile q (0 < q <= 1) of the
// durations recorded, 0 when none were: an upper estimate within a factor of two.
func (s Snapshot) Quantile(q float64) time.Duration {
	n := s.Count()
	if n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(n)))
	var seen uint64
	for i, c := range s.Counts {
		if seen += c; seen >= max(rank, 1) {
			return Bound(i)
		}
	}
	return Bound(Buckets - 1)
}
