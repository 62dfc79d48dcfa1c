package bench

import (
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Latencies are recorded in nanoseconds, 2 significant digits (1% resolution: enough for
// p50/p99/p999, and a 37 KiB histogram that stays in the worker's cache, where 3 digits take
// 221 KiB and showed in profiles), from 1 ns to latencyMax (longer ones are clamped: they
// still count, at latencyMax). One histogram per worker, so recording takes no lock; merged
// when the workload ends.
const (
	latencyMin    = 1
	latencyMax    = int64(60 * time.Second)
	latencyDigits = 2
)

func newLatencyHistogram() *hdrhistogram.Histogram {
	return hdrhistogram.New(latencyMin, latencyMax, latencyDigits)
}

func recordLatency(h *hdrhistogram.Histogram, d time.Duration) {
	v := int64(d)
	if v < latencyMin {
		v = latencyMin
	}
	if v > latencyMax {
		v = latencyMax
	}
	_ = h.RecordValue(v) // in range by construction
}

// latencySummary is what a report shows of a merged histogram, in microseconds.
type latencySummary struct {
	p50, p99, p999, max float64
}

func summarize(h *hdrhistogram.Histogram) latencySummary {
	if h.TotalCount() == 0 {
		return latencySummary{}
	}
	us := func(ns int64) float64 { return float64(ns) / 1e3 }
	return latencySummary{
		p50:  us(h.ValueAtQuantile(50)),
		p99:  us(h.ValueAtQuantile(99)),
		p999: us(h.ValueAtQuantile(99.9)),
		max:  us(h.Max()),
	}
}
