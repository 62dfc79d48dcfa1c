package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// Result is one (engine, workload, cache size) measurement; its JSON form is the schema of
// --json (one object per result under "results").
type Result struct {
	Engine     string `json:"engine"`
	Workload   string `json:"workload"`
	CacheBytes int64  `json:"cache_bytes"`
	// Cache is CacheBytes as printed ("1MiB"), or "none" for an engine without a cache
	// setting.
	Cache     string  `json:"cache"`
	Ops       uint64  `json:"ops"`
	Seconds   float64 `json:"seconds"`
	OpsPerSec float64 `json:"ops_per_sec"`
	P50us     float64 `json:"p50_us"`
	P99us     float64 `json:"p99_us"`
	P999us    float64 `json:"p999_us"`
	MaxUs     float64 `json:"max_us"`
	// NetBytesPerOp counts TCP bytes between this process and the store, both directions.
	NetBytesPerOp float64 `json:"net_bytes_per_op"`
	// WALBytesPerOp counts bytes appended to the store's log.
	WALBytesPerOp float64 `json:"wal_bytes_per_op"`
	// OpsPerWALSync is ops per fsync of the log (group commit), 0 when not counted.
	OpsPerWALSync float64 `json:"ops_per_wal_sync"`
	// CPUusPerOp is CPU time per op: this process's, plus a spawned store process's
	// (storage node, redis-server). Unlike ops/s it does not depend on how many cores the
	// run got, so it compares across machines and noisy neighbours.
	CPUusPerOp float64 `json:"cpu_us_per_op"`
	// HitRatio is the cache hit ratio, null for an engine without a cache to count.
	HitRatio   *float64 `json:"hit_ratio"`
	Errors     uint64   `json:"errors"`
	FirstError string   `json:"first_error,omitempty"`
	// Series is the run over time: throughput and latency per interval (report.go).
	Series []Point `json:"series,omitempty"`
}

// Meta describes a run in the JSON file.
type Meta struct {
	Program    string   `json:"program"`
	Args       []string `json:"args"`
	Date       string   `json:"date"`
	Commit     string   `json:"commit"`
	GoVersion  string   `json:"go_version"`
	GOOS       string   `json:"goos"`
	GOARCH     string   `json:"goarch"`
	CPU        string   `json:"cpu"`
	CPUs       int      `json:"cpus"`
	Records    int      `json:"records"`
	Workers    int      `json:"workers"`
	RowBytes   int      `json:"row_bytes"`
	Duration   string   `json:"duration"`
	Durability string   `json:"durability"`
	Sync       string   `json:"sync"`
	Deployment string   `json:"deployment"`
	Async      int      `json:"async"`
	// LoadAvgStart and LoadAvgEnd are the machine's 1/5/15-minute load averages when the run
	// started and ended: figures measured beside other work are not comparable.
	LoadAvgStart string   `json:"load_avg_start,omitempty"`
	LoadAvgEnd   string   `json:"load_avg_end,omitempty"`
	Notes        []string `json:"notes,omitempty"`
}

// Report is the content of --json.
type Report struct {
	Meta    Meta     `json:"meta"`
	Results []Result `json:"results"`
}

func newResult(engine, workload string, cacheBytes int64, cacheSensitive bool, o outcome) Result {
	r := Result{Engine: engine, Workload: workload, CacheBytes: cacheBytes, Cache: "none",
		Ops: o.ops, Seconds: o.elapsed.Seconds(), Errors: o.errs}
	if cacheSensitive {
		r.Cache = FormatBytes(cacheBytes)
	} else {
		r.CacheBytes = 0
	}
	if o.firstErr != nil {
		r.FirstError = o.firstErr.Error()
	}
	if r.Seconds > 0 {
		r.OpsPerSec = float64(o.ops) / r.Seconds
	}
	ls := summarize(o.hist)
	r.P50us, r.P99us, r.P999us, r.MaxUs = ls.p50, ls.p99, ls.p999, ls.max
	if o.interval > 0 {
		r.Series = seriesPointsOf(o.series, o.interval)
	}
	if o.ops > 0 {
		r.NetBytesPerOp = float64(o.after.NetBytes-o.before.NetBytes) / float64(o.ops)
		r.WALBytesPerOp = float64(o.after.WALBytes-o.before.WALBytes) / float64(o.ops)
		if o.after.NetBytes < o.before.NetBytes { // a connection closed meanwhile
			r.NetBytesPerOp = 0
		}
		if o.after.WALBytes < o.before.WALBytes {
			r.WALBytesPerOp = 0
		}
		cpu := o.cpu + max(o.after.ServerCPU-o.before.ServerCPU, 0)
		r.CPUusPerOp = float64(cpu.Microseconds()) / float64(o.ops)
		if syncs := o.after.WALSyncs - o.before.WALSyncs; syncs > 0 && o.after.WALSyncs > o.before.WALSyncs {
			r.OpsPerWALSync = float64(o.ops) / float64(syncs)
		}
	}
	if o.after.HasCache {
		lookups := o.after.CacheLookups - o.before.CacheLookups
		if o.after.CacheLookups == 0 {
			lookups = o.reads
		}
		if lookups > 0 {
			misses := min(o.after.CacheMisses-o.before.CacheMisses, lookups)
			h := 1 - float64(misses)/float64(lookups)
			r.HitRatio = &h
		}
	}
	return r
}

// The source article's table (seed 003) is its authors' claim, not a measurement of this run:
// a 12700H laptop (sourceCores cores), 30M 64-byte rows, 128 concurrent transactions, one
// transaction node and one storage node. sourceOpsPerSec holds it by workload, for the 1 MB and
// 1 GB transaction-node caches; 0 where the table has none.
const (
	sourceCores  = 14
	sourceLegend = "claim: the source article's figure for the same workload and cache (its authors' claim on a 14-core 12700H laptop, 30M rows, 128 transactions; not measured here); /core: ops/s divided by the cores (this machine's, or the claim's 14)"
)

var sourceOpsPerSec = map[string][2]float64{
	WorkloadInsert:       {7.74e6, 0},
	WorkloadUpdateRandom: {1.73e6, 6.97e6},
	WorkloadUpdateSeq:    {8.78e6, 14.05e6},
	WorkloadQueryRandom:  {3.21e6, 8.05e6},
	WorkloadQuerySeq:     {8.77e6, 15.85e6},
}

// sourceClaim is the source's ops/s for a result's workload and cache: its 1 MB column for a
// cache under 1 GiB, its 1 GB column from 1 GiB up; 0 for a peer or where it has none.
func sourceClaim(r Result) float64 {
	if r.Engine != WeftEngine {
		return 0
	}
	claims := sourceOpsPerSec[r.Workload]
	cache, err := ParseSize(r.Cache)
	if err != nil {
		return 0
	}
	if cache >= 1<<30 {
		return claims[1]
	}
	return claims[0]
}

// FormatBytes prints a byte count with a binary unit when it is a whole number of them.
func FormatBytes(n int64) string {
	units := []string{"TiB", "GiB", "MiB", "KiB"}
	for i, u := range units {
		size := int64(1) << (10 * (len(units) - i))
		if n >= size && n%size == 0 {
			return fmt.Sprintf("%d%s", n/size, u)
		}
	}
	return fmt.Sprintf("%dB", n)
}

// humanRate prints ops/s with a metric suffix: 1.23M.
func humanRate(v float64) string {
	switch {
	case v >= 1e9:
		return fmt.Sprintf("%.2fG", v/1e9)
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.1fK", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

func fmtLatency(us float64) string {
	switch {
	case us >= 1e6:
		return fmt.Sprintf("%.2fs", us/1e6)
	case us >= 1e3:
		return fmt.Sprintf("%.2fms", us/1e3)
	case us >= 10:
		return fmt.Sprintf("%.0fus", us)
	}
	return fmt.Sprintf("%.2fus", us)
}

func fmtHit(h *float64) string {
	if h == nil {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100**h)
}

// column is one (engine, cache) pair of the summary tables, in run order.
type column struct {
	engine, cache string
}

func columnsOf(rs []Result) []column {
	var cols []column
	for _, r := range rs {
		c := column{r.Engine, r.Cache}
		if !slices.Contains(cols, c) {
			cols = append(cols, c)
		}
	}
	return cols
}

func find(rs []Result, engine, cache, workload string) *Result {
	for i := range rs {
		if rs[i].Engine == engine && rs[i].Cache == cache && rs[i].Workload == workload {
			return &rs[i]
		}
	}
	return nil
}

// writeTable prints rows under header in aligned columns: the first leftCols columns (names)
// aligned left, the rest (numbers) right.
func writeTable(w io.Writer, header []string, rows [][]string, leftCols int) {
	widths := make([]int, len(header))
	for _, row := range append([][]string{header}, rows...) {
		for i, cell := range row {
			widths[i] = max(widths[i], len(cell))
		}
	}
	for _, row := range append([][]string{header}, rows...) {
		var b strings.Builder
		for i, cell := range row {
			if i > 0 {
				b.WriteString("  ")
			}
			pad := strings.Repeat(" ", widths[i]-len(cell))
			if i < leftCols {
				b.WriteString(cell + pad)
			} else {
				b.WriteString(pad + cell)
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
}

// writeResults prints every result once, with all its measures, the figure per core of this
// machine, and the source's claim for the same workload and cache beside it (sourceLegend).
func writeResults(w io.Writer, rs []Result, cores int) {
	header := []string{"engine", "workload", "cache", "ops/s", "/core", "CPU us/op", "claim", "claim/core",
		"p50", "p99", "p999", "net B/op", "WAL B/op", "ops/sync", "hit", "errors"}
	var rows [][]string
	for _, r := range rs {
		perSync := "-"
		if r.OpsPerWALSync > 0 {
			perSync = fmt.Sprintf("%.0f", r.OpsPerWALSync)
		}
		claim, claimCore := "-", "-"
		if v := sourceClaim(r); v > 0 {
			claim, claimCore = humanRate(v), humanRate(v/sourceCores)
		}
		rows = append(rows, []string{r.Engine, r.Workload, r.Cache, humanRate(r.OpsPerSec),
			humanRate(r.OpsPerSec / float64(max(cores, 1))), fmt.Sprintf("%.2f", r.CPUusPerOp), claim, claimCore,
			fmtLatency(r.P50us), fmtLatency(r.P99us), fmtLatency(r.P999us),
			fmt.Sprintf("%.1f", r.NetBytesPerOp), fmt.Sprintf("%.1f", r.WALBytesPerOp), perSync,
			fmtHit(r.HitRatio), fmt.Sprint(r.Errors)})
	}
	writeTable(w, header, rows, 3)
	fmt.Fprintln(w, sourceLegend)
}

// writeRatios prints Weft's ops/s over each peer's, per workload and Weft cache size.
func writeRatios(w io.Writer, rs []Result, workloads []string) {
	var weft []column
	var peers []string
	for _, c := range columnsOf(rs) {
		switch {
		case c.engine == WeftEngine:
			weft = append(weft, c)
		case !slices.Contains(peers, c.engine):
			peers = append(peers, c.engine)
		}
	}
	if len(weft) == 0 || len(peers) == 0 {
		return
	}
	fmt.Fprintln(w, "weft ops/s divided by each peer's (the peer at the same cache size, or its only run):")
	header := []string{"workload", "weft cache"}
	for _, p := range peers {
		header = append(header, "/"+p)
	}
	var rows [][]string
	for _, wl := range workloads {
		for _, wc := range weft {
			wr := find(rs, WeftEngine, wc.cache, wl)
			if wr == nil {
				continue
			}
			row := []string{wl, wc.cache}
			for _, p := range peers {
				pr := find(rs, p, wc.cache, wl)
				if pr == nil {
					pr = find(rs, p, "none", wl)
				}
				cell := "-"
				if pr != nil && pr.OpsPerSec > 0 {
					cell = fmt.Sprintf("%.2fx", wr.OpsPerSec/pr.OpsPerSec)
				}
				row = append(row, cell)
			}
			rows = append(rows, row)
		}
	}
	writeTable(w, header, rows, 2)
	fmt.Fprintln(w)
}

// writeBenchLines prints one Go benchmark line per result, for benchstat.
func writeBenchLines(w io.Writer, rs []Result, pkg string) {
	fmt.Fprintf(w, "goos: %s\ngoarch: %s\npkg: %s\n", goos(), goarch(), pkg)
	if cpu := cpuModel(); cpu != "" {
		fmt.Fprintf(w, "cpu: %s\n", cpu)
	}
	for _, r := range rs {
		nsPerOp := 0.0
		if r.OpsPerSec > 0 {
			nsPerOp = 1e9 / r.OpsPerSec
		}
		fmt.Fprintf(w, "BenchmarkCRUD/engine=%s/workload=%s/cache=%s\t%d\t%.2f ns/op\t%.0f ops/s\t%.0f p50-ns\t%.0f p99-ns\t%.0f p999-ns\t%.1f net-B/op\t%.1f WAL-B/op\t%.0f cpu-ns/op",
			r.Engine, r.Workload, r.Cache, max(r.Ops, 1), nsPerOp, r.OpsPerSec, r.P50us*1e3, r.P99us*1e3, r.P999us*1e3,
			r.NetBytesPerOp, r.WALBytesPerOp, r.CPUusPerOp*1e3)
		if r.HitRatio != nil {
			fmt.Fprintf(w, "\t%.4f hit-ratio", *r.HitRatio)
		}
		fmt.Fprintln(w)
	}
}

// writeJSON writes the report to file.
func writeJSON(file string, rep Report) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(file, append(b, '\n'), 0o644)
}

// cpuModel reads the CPU's model name (Linux), or "".
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
