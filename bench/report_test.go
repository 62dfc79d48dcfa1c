package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A run's ops land in the interval in which they ended, merged over the workers, and the
// report draws one chart of four lines per run (issue 23 item 8).
func TestSeriesAndReport(t *testing.T) {
	a, b := &worker{series: newSeries(time.Second)}, &worker{series: newSeries(time.Second)}
	require.Equal(t, seriesIntervalMin, a.series.interval, "1 s / 60 is under the minimum")
	a.series.record(50*time.Millisecond, time.Millisecond)
	b.series.record(60*time.Millisecond, 2*time.Millisecond)
	b.series.record(250*time.Millisecond, 40*time.Millisecond) // a stall in the third interval
	b.series.record(time.Hour, time.Millisecond)               // past the kept intervals: the last
	snaps := mergeSeries([]*worker{a, b})
	require.Len(t, snaps, seriesMax)
	require.Equal(t, uint64(2), snaps[0].Count())
	require.Zero(t, snaps[1].Count())
	pts := seriesPointsOf(snaps, a.series.interval)
	require.InDelta(t, 20.0, pts[0].OpsPerSec, 0.001, "two ops in 100 ms")
	require.Equal(t, 65536.0, pts[2].P99us, "the stall shows in its interval")
	require.Equal(t, 2048.0, pts[0].P999us)

	file := filepath.Join(t.TempDir(), "r.html")
	rs := []Result{{Engine: "weft", Workload: WorkloadUpdateRandom, Cache: "1MiB", Series: pts[:3]}, {Engine: "weft", Workload: WorkloadInsert, Cache: "1MiB"}}
	require.NoError(t, writeReport(file, Meta{Program: "crudbench <x>"}, rs))
	b2, err := os.ReadFile(file)
	require.NoError(t, err)
	out := string(b2)
	require.Equal(t, 1, strings.Count(out, "<svg"), "one chart for the run with points")
	require.Equal(t, 4, strings.Count(out, "<polyline"), "throughput, p50, p99, p999")
	require.Contains(t, out, "<p>no ops</p>")
	require.Contains(t, out, "crudbench &lt;x&gt;", "text is escaped")
}
