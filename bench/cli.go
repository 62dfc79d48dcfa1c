package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/weftdb/weft/sgio"
)

// Defaults of the command line.
const (
	DefaultRecords  = 3_000_000
	DefaultWorkers  = 128
	DefaultCaches   = "1MiB,1GiB"
	DefaultDuration = 3 * time.Second
	DefaultRowBytes = 64
)

// Config is a parsed command line.
type Config struct {
	Records    int
	Workers    int
	Caches     []int64
	Duration   time.Duration
	RowBytes   int
	Durability string
	Sync       string
	Workloads  []string
	Async      int
	FullPageIO bool
	JSON       string
	Quiet      bool
	// BenchLines adds one Go benchmark line per result to the report, for benchstat.
	BenchLines bool
	// Report is the HTML file of the runs over time (report.go); "" for none.
	Report     string
	StoreAddr  string
	Secret     string
	SpawnStore bool
	// Cluster is --cluster N: etcd in this process and N storage node children, the
	// workloads through a cluster node (cluster.go); 0 = off.
	Cluster int
	// StoreCacheBytes is the embedded or spawned store's disk page cache; 0 = enough for the
	// table (the storage node is the big-cache side).
	StoreCacheBytes int64
	// Engines selects engines by name ("all" or empty: every one given to Main).
	Engines []string
	// CPUProfile is the path prefix of CPU profiles (pprof), one per workload run:
	// <prefix>.<engine>.<cache>.<workload>.
	CPUProfile string
}

// Program describes the main calling Main.
type Program struct {
	// Name is the program's name in usage and reports ("crudbench").
	Name string
	// Pkg is the import path printed in the benchmark lines' "pkg:" header.
	Pkg string
	// Peers are engines to run after Weft (bench/peers).
	Peers []Factory
}

func parseFlags(prog Program, args []string, stderr io.Writer) (*Config, error) {
	fs := flag.NewFlagSet(prog.Name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &Config{}
	caches := DefaultCaches
	workloads := "all"
	storeCache := "auto"
	engines := "all"
	fs.IntVar(&c.Records, "records", DefaultRecords, "rows in the loaded table (30000000 reproduces the source)")
	fs.IntVar(&c.Workers, "workers", DefaultWorkers, "concurrent goroutines, one transaction each at a time")
	fs.StringVar(&caches, "cache", caches, "comma-separated txn-node cache sizes, each a run (e.g. 1MiB,1GiB,4GiB)")
	fs.DurationVar(&c.Duration, "duration", DefaultDuration, "time per workload")
	fs.IntVar(&c.RowBytes, "row-size", DefaultRowBytes, "row size in bytes (8..4096, a multiple of 8)")
	fs.StringVar(&c.Durability, "durability", "durable", "weft commit durability: durable or writeback")
	fs.StringVar(&c.Sync, "sync", "always", "WAL sync mode of the embedded or spawned store (and of the peers): always or none")
	fs.StringVar(&workloads, "workloads", workloads, "comma-separated subset of "+strings.Join(Workloads, ","))
	fs.IntVar(&c.Async, "async", 0, "transactions each worker keeps in flight via Session.Go (0: synchronous)")
	fs.BoolVar(&c.FullPageIO, "full-page-io", false, "ablation: fetch and ship whole pages instead of sparse rows")
	fs.StringVar(&c.JSON, "json", "", "write the results to this file as JSON")
	fs.BoolVar(&c.Quiet, "quiet", false, "no progress bar or per-workload lines on stderr")
	fs.BoolVar(&c.BenchLines, "bench-lines", false, "also print each result as a Go benchmark line (for benchstat)")
	fs.StringVar(&c.Report, "report", "", "write each run's throughput and p50/p99/p999 over time to this HTML file (SVG charts)")
	fs.StringVar(&c.StoreAddr, "store", "", "use the storage node at this address instead of the embedded store")
	secretFile := ""
	fs.StringVar(&secretFile, "secret-file", os.Getenv("WEFT_SECRET_FILE"), "file holding the --store storage node's clients' secret (default $WEFT_SECRET_FILE)")
	fs.BoolVar(&c.SpawnStore, "spawn-store", false, "run the storage node in a child process (this binary) on a free loopback port")
	fs.IntVar(&c.Cluster, "cluster", 0, "run weft as a cluster: etcd in this process, N storage nodes in child processes (this binary), one cluster node owning every partition")
	fs.StringVar(&c.CPUProfile, "cpuprofile", "", "write a CPU profile of each workload run to PREFIX.<engine>.<cache>.<workload> (go tool pprof)")
	fs.StringVar(&storeCache, "store-cache", storeCache, "disk page cache of the embedded or spawned store (auto: the table's size, at least 256MiB)")
	if len(prog.Peers) > 0 {
		names := []string{WeftEngine}
		for _, p := range prog.Peers {
			names = append(names, p.Name)
		}
		fs.StringVar(&engines, "engines", engines, "comma-separated subset of "+strings.Join(names, ","))
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if secretFile != "" {
		b, err := os.ReadFile(secretFile)
		if err != nil {
			return nil, fmt.Errorf("--secret-file: %w", err)
		}
		if c.Secret = strings.TrimSpace(string(b)); c.Secret == "" {
			return nil, fmt.Errorf("--secret-file %s: empty", secretFile)
		}
	}
	if c.Caches, err = ParseSizes(caches); err != nil {
		return nil, err
	}
	if c.Workloads, err = ParseWorkloads(workloads); err != nil {
		return nil, err
	}
	if storeCache != "auto" {
		if c.StoreCacheBytes, err = ParseSize(storeCache); err != nil {
			return nil, err
		}
	}
	if engines != "all" && engines != "" {
		c.Engines = strings.Split(engines, ",")
	}
	switch {
	case c.Records < 1:
		return nil, errors.New("--records must be at least 1")
	case c.Workers < 1:
		return nil, errors.New("--workers must be at least 1")
	case c.Duration <= 0:
		return nil, errors.New("--duration must be positive")
	case c.RowBytes < 8 || c.RowBytes > 4096 || c.RowBytes%8 != 0:
		return nil, errors.New("--row-size must be 8..4096 and a multiple of 8")
	case c.Async < 0:
		return nil, errors.New("--async must not be negative")
	case c.Sync != "always" && c.Sync != "none":
		return nil, fmt.Errorf("--sync %q: want always or none", c.Sync)
	case c.Durability != "durable" && c.Durability != "writeback":
		return nil, fmt.Errorf("--durability %q: want durable or writeback", c.Durability)
	case c.StoreAddr != "" && c.SpawnStore:
		return nil, errors.New("--store and --spawn-store exclude each other")
	case c.Cluster < 0 || c.Cluster > 64:
		return nil, errors.New("--cluster must be 1..64 storage nodes")
	case c.Cluster > 0 && (c.StoreAddr != "" || c.SpawnStore):
		return nil, errors.New("--cluster excludes --store and --spawn-store (it starts its own storage nodes)")
	case c.Cluster > 0 && (c.Async > 0 || c.FullPageIO):
		return nil, errors.New("--cluster runs synchronous ops with sparse row IO: no --async or --full-page-io (cluster/node has neither)")
	}
	return c, nil
}

// ParseSizes parses a comma-separated list of sizes.
func ParseSizes(s string) ([]int64, error) {
	var out []int64
	for _, f := range strings.Split(s, ",") {
		n, err := ParseSize(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

// ParseSize parses a byte size: a number with an optional unit, B, KiB/MiB/GiB/TiB (or K, M,
// G, T: also binary), KB/MB/GB/TB (decimal).
func ParseSize(s string) (int64, error) {
	i := strings.IndexFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, unit := s, ""
	if i >= 0 {
		num, unit = s[:i], strings.TrimSpace(s[i:])
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("size %q: want a number with an optional unit such as MiB or GiB", s)
	}
	mult := map[string]float64{"": 1, "B": 1,
		"K": 1 << 10, "KiB": 1 << 10, "M": 1 << 20, "MiB": 1 << 20, "G": 1 << 30, "GiB": 1 << 30, "T": 1 << 40, "TiB": 1 << 40,
		"KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}[unit]
	if mult == 0 {
		return 0, fmt.Errorf("size %q: unknown unit %q", s, unit)
	}
	return int64(v * mult), nil
}

// runner holds the state of one Main.
type runner struct {
	cfg    *Config
	prog   Program
	stdout io.Writer
	stderr io.Writer
	bar    bool // show progress bars
	notes  []string
	hists  []*hdrhistogram.Histogram
	zipfs  map[uint64]*zipf
	failed bool
}

func (r *runner) logf(format string, args ...any) {
	if !r.cfg.Quiet {
		fmt.Fprintf(r.stderr, format+"\n", args...)
	}
}

func (r *runner) note(format string, args ...any) {
	n := fmt.Sprintf(format, args...)
	if !slices.Contains(r.notes, n) {
		r.notes = append(r.notes, n)
	}
}

// Main runs the benchmark as the command line args say, prints the report to stdout, and
// returns the process exit code: 0, 1 when a workload had errors or an engine failed, 2 for
// a bad command line.
func Main(ctx context.Context, prog Program, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(prog, args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "%s: %v\n", prog.Name, err)
		return 2
	}
	r := &runner{cfg: cfg, prog: prog, stdout: stdout, stderr: stderr, zipfs: map[uint64]*zipf{}}
	if f, ok := stderr.(*os.File); ok && !cfg.Quiet && term.IsTerminal(int(f.Fd())) {
		r.bar = true
	}
	if err := r.run(ctx, args); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", prog.Name, err)
		return 1
	}
	if r.failed {
		return 1
	}
	return 0
}

func (r *runner) run(ctx context.Context, args []string) (err error) {
	cfg := r.cfg
	weftSelected := cfg.Engines == nil || slices.Contains(cfg.Engines, WeftEngine)
	storeCache := cfg.StoreCacheBytes
	if storeCache == 0 {
		storeCache = max(256<<20, int64(cfg.Records)*int64(cfg.RowBytes)*5/4)
	}
	dep := weftDeploy{storeAddr: cfg.StoreAddr, secret: []byte(cfg.Secret), storeCacheBytes: storeCache, fullPageIO: cfg.FullPageIO,
		syncNone: cfg.Sync == "none"}
	deployment, syncShown := "embedded", cfg.Sync
	var cluster *Factory // --cluster's weft, replacing weftFactory(dep)
	switch {
	case cfg.Cluster > 0 && !weftSelected:
		deployment = "embedded (--cluster unused: weft is not among --engines)"
	case cfg.Cluster > 0:
		dir, err := os.MkdirTemp("", "crudbench-etcd-*")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		cd, stop, err := startCluster(ctx, dir, cfg.Cluster, storeChildConfig{Sync: cfg.Sync, CacheBytes: storeCache}, r)
		if err != nil {
			return err
		}
		defer func() {
			if serr := stop(); serr != nil && err == nil {
				err = serr
			}
		}()
		for _, addr := range cd.addrs {
			if _, err := storeSyncMode(ctx, addr, cd.secret); err != nil {
				return fmt.Errorf("storage node at %s: %w", addr, err)
			}
		}
		f := clusterFactory(cd)
		cluster = &f
		deployment = fmt.Sprintf("cluster of %d storage nodes, etcd in-process (sync %s)", cfg.Cluster, cfg.Sync)
	case cfg.SpawnStore && !weftSelected:
		deployment = "embedded (--spawn-store unused: weft is not among --engines)"
	case cfg.SpawnStore:
		child, err := spawnStore(ctx, storeChildConfig{Sync: cfg.Sync, CacheBytes: storeCache}, r.stderr)
		if err != nil {
			return err
		}
		defer func() {
			if serr := child.stop(); serr != nil && err == nil {
				err = serr
			}
		}()
		dep.storeAddr, dep.storePID = child.addr, child.cmd.Process.Pid
		deployment = "spawned storage node at " + child.addr
		r.logf("spawned storage node (pid %d) at %s", child.cmd.Process.Pid, child.addr)
	case cfg.StoreAddr != "":
		deployment = "storage node at " + cfg.StoreAddr
	}
	if dep.storeAddr != "" {
		mode, err := storeSyncMode(ctx, dep.storeAddr, dep.secret)
		if err != nil {
			return fmt.Errorf("storage node at %s: %w", dep.storeAddr, err)
		}
		if cfg.StoreAddr != "" {
			syncShown = mode // --sync does not reach a node we did not start
			dep.syncNone = mode == "none"
		}
		deployment += " (sync " + mode + ")"
	}
	// dep is complete only now (the spawned store's address and pid).
	weft := weftFactory(dep)
	if cluster != nil {
		weft = *cluster
	}
	engines := append([]Factory{weft}, r.prog.Peers...)
	if cfg.Engines != nil {
		var sel []Factory
		for _, name := range cfg.Engines {
			i := slices.IndexFunc(engines, func(f Factory) bool { return f.Name == name })
			if i < 0 {
				return fmt.Errorf("unknown engine %q", name)
			}
			sel = append(sel, engines[i])
		}
		engines = sel
	}
	if cfg.Async > 0 && len(engines) > 1 {
		r.note("--async %d applies to weft only; the peers run one op at a time per worker", cfg.Async)
	}
	r.hists = make([]*hdrhistogram.Histogram, cfg.Workers)
	for i := range r.hists {
		r.hists[i] = newLatencyHistogram()
	}
	meta := Meta{Program: r.prog.Name, Args: args, Date: time.Now().UTC().Format(time.RFC3339), Commit: sourceCommit(),
		GoVersion: runtime.Version(), GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, CPU: cpuModel(), CPUs: runtime.NumCPU(),
		Records: cfg.Records, Workers: cfg.Workers, RowBytes: cfg.RowBytes, Duration: cfg.Duration.String(),
		Durability: cfg.Durability, Sync: syncShown, Deployment: deployment, Async: cfg.Async, LoadAvgStart: loadAverage()}
	fmt.Fprintf(r.stdout, "%s: records=%d workers=%d row=%dB duration=%v durability=%s sync=%s async=%d deployment=%s\n",
		r.prog.Name, cfg.Records, cfg.Workers, cfg.RowBytes, cfg.Duration, cfg.Durability, syncShown, cfg.Async, deployment)
	fmt.Fprintf(r.stdout, "%s %s/%s, %d CPUs (%s), commit %s, %s, load average %s\n\n", meta.GoVersion, meta.GOOS, meta.GOARCH,
		meta.CPUs, meta.CPU, meta.Commit, meta.Date, orDash(meta.LoadAvgStart))
	r.noteLoad("start", meta.LoadAvgStart)

	var results []Result
	for _, f := range engines {
		if f.Note != "" {
			r.note("%s: %s", f.Name, f.Note)
		}
		caches := cfg.Caches
		if !f.CacheSensitive {
			caches = caches[:1]
		}
		for _, cache := range caches {
			rs, err := r.runEngine(ctx, f, cache)
			results = append(results, rs...)
			if errors.Is(err, ErrSkip) {
				r.note("%s skipped: %v", f.Name, err)
				break
			}
			if err != nil {
				if ctx.Err() != nil {
					return err
				}
				r.failed = true
				r.note("%s at cache %s failed: %v", f.Name, FormatBytes(cache), err)
				fmt.Fprintf(r.stderr, "%s: %s at cache %s: %v\n", r.prog.Name, f.Name, FormatBytes(cache), err)
			}
		}
	}
	for _, res := range results {
		if res.Errors > 0 {
			r.failed = true
			r.note("%s %s cache=%s: %d ops failed, first: %s", res.Engine, res.Workload, res.Cache, res.Errors, res.FirstError)
		}
	}
	meta.LoadAvgEnd = loadAverage()
	r.noteLoad("end", meta.LoadAvgEnd)
	meta.Notes = r.notes
	r.report(results)
	fmt.Fprintf(r.stdout, "load average at start %s, at end %s\n", orDash(meta.LoadAvgStart), orDash(meta.LoadAvgEnd))
	if cfg.JSON != "" {
		if err := writeJSON(cfg.JSON, Report{Meta: meta, Results: results}); err != nil {
			return err
		}
	}
	if cfg.Report != "" {
		if err := writeReport(cfg.Report, meta, results); err != nil {
			return err
		}
	}
	return nil
}

func (r *runner) report(results []Result) {
	w := r.stdout
	writeResults(w, results, runtime.NumCPU())
	fmt.Fprintln(w)
	writeRatios(w, results, r.cfg.Workloads)
	if len(r.notes) > 0 {
		for _, n := range r.notes {
			fmt.Fprintf(w, "note: %s\n", n)
		}
		fmt.Fprintln(w)
	}
	if r.cfg.BenchLines {
		writeBenchLines(w, results, r.prog.Pkg)
	}
}

// noteLoad warns when the machine's one-minute load average (as /proc/loadavg gives it, at
// the run's start or end) is above its cores: other work then shares the CPUs the figures
// are measured on.
func (r *runner) noteLoad(when, loadAvg string) {
	first, _, _ := strings.Cut(loadAvg, " ")
	load, err := strconv.ParseFloat(first, 64)
	if err != nil || load <= float64(runtime.NumCPU()) {
		return
	}
	r.note("load average %.2f at the %s is above this machine's %d cores: other work shares the CPUs, so the figures are low and noisy", load, when, runtime.NumCPU())
	r.logf("%s: warning: load average %.2f at the %s is above this machine's %d cores", r.prog.Name, load, when, runtime.NumCPU())
}

// runEngine opens one engine at one cache size, loads the table, runs the workloads and
// closes it.
func (r *runner) runEngine(ctx context.Context, f Factory, cache int64) (_ []Result, err error) {
	cfg := r.cfg
	label := FormatBytes(cache)
	if !f.CacheSensitive {
		label = "none"
	}
	b, err := f.Open(ctx, OpenConfig{CacheBytes: cache, RowBytes: cfg.RowBytes, Workers: cfg.Workers,
		Sync: cfg.Sync, Durability: cfg.Durability, Logf: r.note})
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := b.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close: %w", cerr)
		}
	}()
	start := time.Now()
	first, err := r.load(ctx, b, fmt.Sprintf("load %s cache=%s", f.Name, label))
	if err != nil {
		return nil, err
	}
	loadTime := time.Since(start)
	r.logf("%s cache=%s: loaded %d rows in %v (%s rows/s)", f.Name, label, cfg.Records, loadTime.Round(time.Millisecond),
		humanRate(float64(cfg.Records)/loadTime.Seconds()))
	tb := &table{b: b, first: first, n: uint64(cfg.Records), rowBytes: cfg.RowBytes}
	var results []Result
	for _, wl := range cfg.Workloads {
		if wl == WorkloadDelete && !slices.Contains(cfg.Workloads, WorkloadInsert) {
			// delete deletes only rows insert added: add some, untimed.
			if _, err := runWorkload(ctx, tb, r.spec(WorkloadInsert), r.hists, nil); err != nil {
				return results, err
			}
		}
		var z *zipf
		if wl == WorkloadMixed {
			z = r.zipf(tb.n)
		}
		stopProfile, err := r.startProfile(f.Name, label, wl)
		if err != nil {
			return results, err
		}
		out, err := runWorkload(ctx, tb, r.spec(wl), r.hists, z)
		if perr := stopProfile(); err == nil {
			err = perr
		}
		if err != nil {
			return results, err
		}
		res := newResult(f.Name, wl, cache, f.CacheSensitive, out)
		results = append(results, res)
		r.logf("%-14s %-13s cache=%-5s %9s ops/s  p50 %-8s p99 %-8s p999 %-8s net %6.1f B/op  WAL %6.1f B/op  CPU %6.2f us/op  hit %s",
			f.Name, wl, label, humanRate(res.OpsPerSec), fmtLatency(res.P50us), fmtLatency(res.P99us), fmtLatency(res.P999us),
			res.NetBytesPerOp, res.WALBytesPerOp, res.CPUusPerOp, fmtHit(res.HitRatio))
		if res.Errors > 0 {
			r.logf("  %d errors, first: %s", res.Errors, res.FirstError)
		}
	}
	return results, nil
}

// startProfile starts the CPU profile of one workload run (with --cpuprofile) and returns
// the function that stops it.
func (r *runner) startProfile(engine, cache, workload string) (func() error, error) {
	if r.cfg.CPUProfile == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(fmt.Sprintf("%s.%s.%s.%s", r.cfg.CPUProfile, engine, cache, workload))
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}, nil
}

func (r *runner) spec(wl string) runSpec {
	async := r.cfg.Async
	return runSpec{workload: wl, duration: r.cfg.Duration, workers: r.cfg.Workers, async: async}
}

func (r *runner) zipf(n uint64) *zipf {
	if z := r.zipfs[n]; z != nil {
		return z
	}
	z := newZipf(n, zipfTheta)
	r.zipfs[n] = z
	return z
}

// load loads the table with a progress bar (on a terminal, without --quiet).
func (r *runner) load(ctx context.Context, b Backend, desc string) (uint64, error) {
	var loaded atomic.Int64
	spec := LoadSpec{Records: r.cfg.Records, RowBytes: r.cfg.RowBytes, Workers: r.cfg.Workers, Row: fillRow,
		Progress: func(n int) { loaded.Add(int64(n)) }}
	if !r.bar {
		return b.Load(ctx, spec)
	}
	// The bar's own rate is measured from its creation and shown in rows/hr while it is below
	// 1/s (and absurd after the first tick): we show our own rate, from the first row on.
	bar := progressbar.NewOptions64(int64(r.cfg.Records), progressbar.OptionSetWriter(r.stderr),
		progressbar.OptionSetDescription(desc), progressbar.OptionShowCount(),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionClearOnFinish(), progressbar.OptionSetPredictTime(true))
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		var rate loadRate
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				n := loaded.Load()
				bar.Describe(desc + rate.describe(now, n))
				bar.Set64(n)
			}
		}
	}()
	first, err := b.Load(ctx, spec)
	close(done)
	bar.Set64(loaded.Load())
	bar.Finish()
	return first, err
}

// storeSyncMode reads the storage node's sync mode from its hello reply.
func storeSyncMode(ctx context.Context, addr string, secret []byte) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := sgio.Dial(ctx, sgio.ClientConfig{Addr: addr, Secret: secret, Name: "crudbench-hello"})
	if err != nil {
		return "", err
	}
	defer c.Close()
	if c.Hello().SyncMode == sgio.SyncNone {
		return "none", nil
	}
	return "always", nil
}

// loadRate is the progress bar's rate: rows per second since the first row was seen, shown
// once at least loadRateMinElapsed has passed (a rate over a few milliseconds means nothing).
type loadRate struct {
	start time.Time // when the first row was seen; zero before
	rows0 int64     // rows loaded at start
}

const loadRateMinElapsed = 500 * time.Millisecond

// describe returns ", N rows/s" for the bar's description, or "" while there is no honest
// rate yet. Only the bar's ticker goroutine calls it.
func (l *loadRate) describe(now time.Time, rows int64) string {
	if l.start.IsZero() {
		if rows > 0 {
			l.start, l.rows0 = now, rows
		}
		return ""
	}
	elapsed := now.Sub(l.start)
	if elapsed < loadRateMinElapsed {
		return ""
	}
	return ", " + humanRate(float64(rows-l.rows0)/elapsed.Seconds()) + " rows/s"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func goos() string   { return runtime.GOOS }
func goarch() string { return runtime.GOARCH }
