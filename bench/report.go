package bench

import (
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"strings"
	"time"

	"github.com/weftdb/weft/internal/latency"
)

// The report over time (--report FILE.html): each workload run's throughput and p50, p99 and
// p999 latency per interval, drawn as SVG in one HTML file, so a stall that the run's p999
// hides shows when it happened.
//
//   - Each worker records into its own interval histograms (no sharing on the hot path); the
//     run merges them per interval when it ends.
//   - An interval's latencies are power-of-two buckets (internal/latency): each percentile
//     drawn is an upper estimate within a factor of two; the run's own figures (the table)
//     stay the exact hdrhistogram ones.

// seriesPoints is about how many intervals a run is cut into (at least 100 ms each), and
// seriesMax the most kept (a run longer than planned, ended by its last op, fills the rest
// into the last).
const (
	seriesPoints      = 60
	seriesIntervalMin = 100 * time.Millisecond
	seriesMax         = 4 * seriesPoints
)

// series is one worker's ops by the interval in which they ended.
type series struct {
	interval time.Duration
	h        []latency.Histogram
}

func newSeries(duration time.Duration) series {
	iv := max(duration/seriesPoints, seriesIntervalMin)
	return series{interval: iv, h: make([]latency.Histogram, seriesMax)}
}

// record counts an op that ended at end (since the worker's start) after d.
func (s *series) record(end, d time.Duration) {
	if len(s.h) == 0 {
		return
	}
	s.h[min(int(end/s.interval), len(s.h)-1)].Observe(d)
}

// mergeSeries merges the workers' series, up to the last interval in which an op ended.
func mergeSeries(ws []*worker) []latency.Snapshot {
	var out []latency.Snapshot
	for _, w := range ws {
		for i := range w.series.h {
			snap := w.series.h[i].Snapshot()
			if snap.Count() == 0 {
				continue
			}
			for len(out) <= i {
				out = append(out, latency.Snapshot{})
			}
			for b, c := range snap.Counts {
				out[i].Counts[b] += c
			}
			out[i].Sum += snap.Sum
		}
	}
	return out
}

// Point is one interval of a run: when it ended, the ops per second in it and its latency
// percentiles (upper estimates within a factor of two), in microseconds.
type Point struct {
	T         float64 `json:"t_s"`
	OpsPerSec float64 `json:"ops_per_sec"`
	P50us     float64 `json:"p50_us"`
	P99us     float64 `json:"p99_us"`
	P999us    float64 `json:"p999_us"`
}

func seriesPointsOf(snaps []latency.Snapshot, interval time.Duration) []Point {
	out := make([]Point, 0, len(snaps))
	us := func(d time.Duration) float64 { return float64(d) / 1e3 }
	for i, s := range snaps {
		out = append(out, Point{T: (time.Duration(i+1) * interval).Seconds(),
			OpsPerSec: float64(s.Count()) / interval.Seconds(),
			P50us:     us(s.Quantile(0.5)), P99us: us(s.Quantile(0.99)), P999us: us(s.Quantile(0.999))})
	}
	return out
}

// writeReport writes the HTML report of rs to file.
func writeReport(file string, meta Meta, rs []Result) error {
	var b strings.Builder
	fmt.Fprintf(&b, "<!doctype html>\n<meta charset=utf-8>\n<title>%s %s</title>\n", html.EscapeString(meta.Program), html.EscapeString(meta.Date))
	b.WriteString("<style>body{font:14px sans-serif;margin:2em}svg{background:#fafafa;border:1px solid #ddd}text{font:11px sans-serif}</style>\n")
	fmt.Fprintf(&b, "<h1>%s</h1>\n<p>%s, %s %s/%s, %d CPUs (%s), commit %s; records=%d workers=%d row=%dB duration=%s durability=%s sync=%s deployment=%s</p>\n",
		html.EscapeString(meta.Program), html.EscapeString(meta.Date), html.EscapeString(meta.GoVersion), meta.GOOS, meta.GOARCH, meta.CPUs,
		html.EscapeString(meta.CPU), html.EscapeString(meta.Commit), meta.Records, meta.Workers, meta.RowBytes, meta.Duration,
		meta.Durability, meta.Sync, html.EscapeString(meta.Deployment))
	b.WriteString("<p>Per interval: throughput (blue, left axis) and p50, p99, p999 latency (green, orange, red; right axis, logarithmic; each an upper estimate within a factor of two).</p>\n")
	for _, r := range rs {
		fmt.Fprintf(&b, "<h2>%s %s cache=%s: %s ops/s, p50 %s, p99 %s, p999 %s</h2>\n", html.EscapeString(r.Engine), html.EscapeString(r.Workload),
			html.EscapeString(r.Cache), humanRate(r.OpsPerSec), fmtLatency(r.P50us), fmtLatency(r.P99us), fmtLatency(r.P999us))
		writeChart(&b, r.Series)
	}
	return os.WriteFile(file, []byte(b.String()), 0o644)
}

// writeChart draws one run's points as an SVG chart.
func writeChart(w io.Writer, pts []Point) {
	const width, height, pad = 760, 220, 50
	if len(pts) == 0 {
		fmt.Fprintln(w, "<p>no ops</p>")
		return
	}
	tMax, opsMax, latMin, latMax := 0.0, 1.0, math.Inf(1), 1.0
	for _, p := range pts {
		tMax, opsMax = max(tMax, p.T), max(opsMax, p.OpsPerSec)
		for _, v := range []float64{p.P50us, p.P99us, p.P999us} {
			if v > 0 {
				latMin, latMax = min(latMin, v), max(latMax, v)
			}
		}
	}
	latMin = min(latMin, latMax/10)
	x := func(t float64) float64 { return pad + (width-2*pad)*t/tMax }
	yOps := func(v float64) float64 { return height - pad/2 - (height-pad)*v/opsMax }
	yLat := func(v float64) float64 {
		v = max(v, latMin)
		return height - pad/2 - (height-pad)*math.Log(v/latMin)/math.Log(latMax/latMin)
	}
	fmt.Fprintf(w, "<svg width=%d height=%d viewBox=\"0 0 %d %d\">\n", width, height, width, height)
	line := func(color string, y func(float64) float64, v func(Point) float64) {
		fmt.Fprintf(w, "<polyline fill=none stroke=%s stroke-width=1.5 points=\"", color)
		for _, p := range pts {
			fmt.Fprintf(w, "%.1f,%.1f ", x(p.T), y(v(p)))
		}
		fmt.Fprintln(w, "\"/>")
	}
	line("#1f77b4", yOps, func(p Point) float64 { return p.OpsPerSec })
	line("#2ca02c", yLat, func(p Point) float64 { return p.P50us })
	line("#ff7f0e", yLat, func(p Point) float64 { return p.P99us })
	line("#d62728", yLat, func(p Point) float64 { return p.P999us })
	fmt.Fprintf(w, "<text x=2 y=12>%s ops/s</text><text x=2 y=%d>0</text>\n", humanRate(opsMax), height-pad/2)
	fmt.Fprintf(w, "<text x=%d y=12 text-anchor=end>%s</text><text x=%d y=%d text-anchor=end>%s</text>\n",
		width-2, fmtLatency(latMax), width-2, height-pad/2, fmtLatency(latMin))
	fmt.Fprintf(w, "<text x=%d y=%d text-anchor=middle>%.1f s</text>\n</svg>\n", width-pad, height-4, tMax)
}
