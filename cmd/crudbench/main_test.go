package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/bench"
)

// runMainEnv makes the test binary run main() instead of the tests: the smoke tests run the
// whole program as a process. (--spawn-store's child is this binary too: bench.IsStoreChild
// is checked first, as in main.)
const runMainEnv = "CRUDBENCH_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if bench.IsStoreChild() {
		os.Exit(bench.StoreChildMain())
	}
	if os.Getenv(runMainEnv) != "" {
		main()
		return
	}
	os.Exit(m.Run())
}

// runCrudbench runs the program with args at a tiny size and returns its JSON report; it
// fails the test unless the program exits 0.
func runCrudbench(t *testing.T, args ...string) (bench.Report, string) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "results.json")
	args = append([]string{"--records", "20000", "--duration", "200ms", "--workers", "16", "--quiet", "--json", out}, args...)
	stdout, stderr, err := runMain(t, args...)
	require.NoError(t, err, "crudbench %s\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), stdout, stderr)
	return readReport(t, out), stdout
}

// runMain runs the test binary as the program (main) with args, bounded by two minutes, and
// returns what it wrote to stdout and stderr and how it exited.
func runMain(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1", "TMPDIR="+t.TempDir())
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

// readReport reads the JSON report at path, failing the test on error.
func readReport(t *testing.T, path string) bench.Report {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var rep bench.Report
	require.NoError(t, json.Unmarshal(b, &rep))
	return rep
}

// checkReport checks that every workload ran at every cache size with positive throughput.
func checkReport(t *testing.T, rep bench.Report, stdout string, caches []string) {
	t.Helper()
	require.Len(t, rep.Results, len(bench.Workloads)*len(caches))
	for _, cache := range caches {
		for _, wl := range bench.Workloads {
			var found *bench.Result
			for i, r := range rep.Results {
				if r.Workload == wl && r.Cache == cache {
					found = &rep.Results[i]
				}
			}
			require.NotNil(t, found, "no result for %s at %s", wl, cache)
			require.Equal(t, bench.WeftEngine, found.Engine)
			require.Positive(t, found.OpsPerSec, "%s at %s", wl, cache)
			require.Positive(t, found.Ops, "%s at %s", wl, cache)
			require.Zero(t, found.Errors, "%s at %s: %s", wl, cache, found.FirstError)
			requireResultOnce(t, stdout, wl, cache)
		}
	}
}

// requireResultOnce checks that the report prints the result of wl at cache once: one row of
// the results table (the Go benchmark lines only with --bench-lines).
func requireResultOnce(t *testing.T, stdout, wl, cache string) {
	t.Helper()
	row := regexp.MustCompile(`(?m)^weft +` + regexp.QuoteMeta(wl) + ` +` + regexp.QuoteMeta(cache) + ` `)
	require.Len(t, row.FindAllString(stdout, -1), 1, "%s at %s: one row\n%s", wl, cache, stdout)
	if !strings.Contains(stdout, "BenchmarkCRUD/") {
		return
	}
	require.Contains(t, stdout, "BenchmarkCRUD/engine=weft/workload="+wl+"/cache="+cache+"\t")
}

func TestSmokeEmbedded(t *testing.T) {
	rep, stdout := runCrudbench(t)
	checkReport(t, rep, stdout, []string{"1MiB", "1GiB"})
	require.NotContains(t, stdout, "BenchmarkCRUD/", "the Go benchmark lines only with --bench-lines")
	require.Contains(t, stdout, "not measured here", "the report says what the claim columns are")
	require.Equal(t, "embedded", rep.Meta.Deployment)
	for _, r := range rep.Results {
		if r.Workload == bench.WorkloadUpdateRandom {
			require.Positive(t, r.WALBytesPerOp, "an update writes the WAL")
		}
	}
}

func TestSmokeAsync(t *testing.T) {
	report := filepath.Join(t.TempDir(), "report.html")
	rep, stdout := runCrudbench(t, "--async", "8", "--cache", "1MiB", "--sync", "none", "--bench-lines", "--report", report)
	checkReport(t, rep, stdout, []string{"1MiB"})
	html, err := os.ReadFile(report)
	require.NoError(t, err, "--report writes the runs over time")
	require.Equal(t, len(bench.Workloads), strings.Count(string(html), "<svg"), "a chart per run")
	for _, r := range rep.Results {
		require.NotEmpty(t, r.Series, "%s: its points in the JSON too", r.Workload)
	}
	require.Contains(t, stdout, "BenchmarkCRUD/", "--bench-lines adds the Go benchmark lines")
	for _, r := range rep.Results {
		// With sync none the log's fsyncs are id grants and checkpoints: no ops/sync figure.
		require.Zero(t, r.OpsPerWALSync, "%s: ops/sync under sync none", r.Workload)
	}
	require.NotContains(t, rep.Meta.Commit, "uncommitted")
	require.NotEmpty(t, rep.Meta.Commit)
	require.Contains(t, stdout, "load average at start ")
	if runtime.GOOS == "linux" {
		require.NotEmpty(t, rep.Meta.LoadAvgStart)
		require.NotEmpty(t, rep.Meta.LoadAvgEnd)
	}
}

func TestSmokeSpawnStore(t *testing.T) {
	rep, stdout := runCrudbench(t, "--spawn-store", "--cache", "1MiB,1GiB")
	checkReport(t, rep, stdout, []string{"1MiB", "1GiB"})
	require.True(t, strings.HasPrefix(rep.Meta.Deployment, "spawned storage node at 127.0.0.1:"), rep.Meta.Deployment)
	for _, r := range rep.Results {
		if r.Workload == bench.WorkloadUpdateRandom {
			require.Positive(t, r.NetBytesPerOp, "an update crosses the wire")
		}
	}
}

// spawnedPIDs returns the storage node children a run without --quiet reported on stderr.
func spawnedPIDs(t *testing.T, stderr string) []int {
	t.Helper()
	var pids []int
	for _, line := range strings.Split(stderr, "\n") {
		if _, rest, ok := strings.Cut(line, "spawned storage node (pid "); ok {
			n, _, _ := strings.Cut(rest, ")")
			pid, err := strconv.Atoi(n)
			require.NoError(t, err, line)
			pids = append(pids, pid)
		}
	}
	return pids
}

// requireGone checks that none of pids is a live process: crudbench waits for its children
// before it exits, so they are gone (and reaped) once it has.
func requireGone(t *testing.T, pids []int) {
	t.Helper()
	for _, pid := range pids {
		err := syscall.Kill(pid, 0)
		require.ErrorIs(t, err, syscall.ESRCH, "storage node child %d outlived crudbench", pid)
	}
}

func TestSmokeCluster(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the children's end is checked with kill(pid, 0) on Linux")
	}
	out := filepath.Join(t.TempDir(), "results.json")
	wls := []string{bench.WorkloadInsert, bench.WorkloadUpdateRandom, bench.WorkloadQueryRandom}
	args := []string{"--cluster", "2", "--records", "20000", "--duration", "300ms", "--workers", "16", "--cache", "1MiB",
		"--workloads", strings.Join(wls, ","), "--json", out}
	stdout, stderr, err := runMain(t, args...)
	require.NoError(t, err, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	pids := spawnedPIDs(t, stderr)
	require.Len(t, pids, 2, stderr)
	requireGone(t, pids)

	rep := readReport(t, out)
	require.Equal(t, "cluster of 2 storage nodes, etcd in-process (sync always)", rep.Meta.Deployment)
	require.Contains(t, stdout, "deployment=cluster of 2 storage nodes, etcd in-process")
	require.Len(t, rep.Results, len(wls))
	for i, wl := range wls {
		r := rep.Results[i]
		require.Equal(t, wl, r.Workload)
		require.Equal(t, bench.WeftEngine, r.Engine)
		require.Positive(t, r.Ops, wl)
		require.Positive(t, r.CPUusPerOp, wl)
		require.Zero(t, r.Errors, "%s: %s", wl, r.FirstError)
		requireResultOnce(t, stdout, wl, "1MiB")
		if wl != bench.WorkloadQueryRandom {
			require.Positive(t, r.WALBytesPerOp, "%s writes the storage nodes' WALs", wl)
			require.Positive(t, r.NetBytesPerOp, "%s crosses the wire", wl)
		}
	}
}

// startClusterLoad starts a --cluster run of 2 storage nodes with far more rows than load
// before a signal (a signal lands during the load) and returns once both storage nodes are
// spawned: the command (killed two minutes on, or when the test ends), its stderr pipe and
// what it wrote there so far.
func startClusterLoad(t *testing.T) (*exec.Cmd, io.Reader, *strings.Builder) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, os.Args[0], "--cluster", "2", "--records", "50000000", "--workers", "8", "--cache", "1MiB")
	cmd.Env = append(os.Environ(), runMainEnv+"=1", "TMPDIR="+t.TempDir())
	stderrPipe, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	var stderr strings.Builder
	sc := bufio.NewScanner(stderrPipe)
	spawned := 0
	for spawned < 2 && sc.Scan() {
		stderr.WriteString(sc.Text() + "\n")
		if strings.Contains(sc.Text(), "spawned storage node (pid ") {
			spawned++
		}
	}
	require.Equal(t, 2, spawned, stderr.String())
	return cmd, stderrPipe, &stderr
}

// TestClusterInterrupt stops a --cluster run with SIGINT while it loads: crudbench exits
// with its storage node children gone.
func TestClusterInterrupt(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the children's end is checked with kill(pid, 0) on Linux")
	}
	cmd, stderrPipe, stderr := startClusterLoad(t)
	require.NoError(t, cmd.Process.Signal(os.Interrupt))
	rest, _ := io.ReadAll(stderrPipe)
	stderr.Write(rest)
	err := cmd.Wait()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "an interrupted run does not exit 0\n%s", stderr.String())
	require.Equal(t, 1, exit.ExitCode(), stderr.String())
	requireGone(t, spawnedPIDs(t, stderr.String()))
}

// TestClusterParentKilled kills a --cluster run with SIGKILL: its storage node children see
// their stdin close and exit by themselves. They hold crudbench's stderr, so its end of file
// is the proof that every one of them has exited.
func TestClusterParentKilled(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("linux only, as the other cluster tests")
	}
	cmd, stderrPipe, _ := startClusterLoad(t)
	require.NoError(t, cmd.Process.Kill())
	eof := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, stderrPipe)
		eof <- err
	}()
	// Bounded: a child that outlived its parent would hold the pipe open for good.
	bound := time.NewTimer(time.Minute)
	defer bound.Stop()
	select {
	case <-eof:
	case <-bound.C:
		t.Fatal("a storage node child still holds stderr a minute after its parent was killed")
	}
	require.Error(t, cmd.Wait())
}
