package bench

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestNewResult(t *testing.T) {
	h := newLatencyHistogram()
	for i := range 1000 {
		recordLatency(h, time.Duration(i+1)*time.Microsecond)
	}
	o := outcome{ops: 1000, reads: 1000, elapsed: 2 * time.Second, hist: h,
		before: Stats{NetBytes: 100, WALBytes: 1000, HasCache: true, CacheMisses: 10},
		after:  Stats{NetBytes: 64100, WALBytes: 101000, HasCache: true, CacheMisses: 260}}
	r := newResult("weft", WorkloadUpdateRandom, 1<<20, true, o)
	require.Equal(t, "1MiB", r.Cache)
	require.InDelta(t, 500, r.OpsPerSec, 1e-9)
	require.InDelta(t, 64, r.NetBytesPerOp, 1e-9)
	require.InDelta(t, 100, r.WALBytesPerOp, 1e-9)
	require.NotNil(t, r.HitRatio)
	require.InDelta(t, 0.75, *r.HitRatio, 1e-9)
	require.InDelta(t, 500, r.P50us, 500*0.01, "1%% resolution")
	require.InDelta(t, 990, r.P99us, 990*0.01)

	o.after.HasCache, o.before.HasCache = false, false
	r = newResult("map", WorkloadInsert, 1<<20, false, o)
	require.Nil(t, r.HitRatio)
	require.Equal(t, "none", r.Cache)
	require.Zero(t, r.CacheBytes)
}

// benchLine is the Go benchmark format benchstat reads: name, iterations, value-unit pairs.
var benchLine = regexp.MustCompile(`^Benchmark[A-Z][^\s]*\t\d+(\t[0-9.]+ [^\s]+)+$`)

func TestReportFormats(t *testing.T) {
	h := newLatencyHistogram()
	recordLatency(h, time.Microsecond)
	hit := 0.5
	rs := []Result{
		newResult("weft", WorkloadUpdateRandom, 1<<20, true, outcome{ops: 10, reads: 10, elapsed: time.Second, hist: h}),
		{Engine: "map", Workload: WorkloadUpdateRandom, Cache: "none", Ops: 5, OpsPerSec: 5, HitRatio: &hit},
	}
	var b bytes.Buffer
	writeBenchLines(&b, rs, "github.com/weftdb/weft/cmd/crudbench")
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	var n int
	for _, l := range lines {
		if strings.HasPrefix(l, "Benchmark") {
			require.Regexp(t, benchLine, l)
			n++
		}
	}
	require.Equal(t, 2, n)
	require.Contains(t, b.String(), "BenchmarkCRUD/engine=weft/workload=update-random/cache=1MiB\t10\t")

	b.Reset()
	writeResults(&b, rs, 2)
	require.Contains(t, b.String(), "claim/core")
	require.Contains(t, b.String(), "1.73M", "the source's claim for random updates at 1 MiB")
	require.Contains(t, b.String(), "123.6K", "the claim per core: 1.73M over 14 cores")
	require.Contains(t, b.String(), "not measured here", "the legend says what the claim is")
	require.Equal(t, 1, strings.Count(b.String(), "update-random  1MiB"), "each result once")
	b.Reset()
	writeRatios(&b, rs, Workloads)
	require.Contains(t, b.String(), "2.00x")
}
