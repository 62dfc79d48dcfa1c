package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
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
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1", "TMPDIR="+t.TempDir())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	require.NoError(t, err, "crudbench %s\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), stdout.String(), stderr.String())
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	var rep bench.Report
	require.NoError(t, json.Unmarshal(b, &rep))
	return rep, stdout.String()
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
			require.Contains(t, stdout, "BenchmarkCRUD/engine=weft/workload="+wl+"/cache="+cache+"\t")
		}
	}
}

func TestSmokeEmbedded(t *testing.T) {
	rep, stdout := runCrudbench(t)
	checkReport(t, rep, stdout, []string{"1MiB", "1GiB"})
	require.Equal(t, "embedded", rep.Meta.Deployment)
	for _, r := range rep.Results {
		if r.Workload == bench.WorkloadUpdateRandom {
			require.Positive(t, r.WALBytesPerOp, "an update writes the WAL")
		}
	}
}

func TestSmokeAsync(t *testing.T) {
	rep, stdout := runCrudbench(t, "--async", "8", "--cache", "1MiB", "--sync", "none")
	checkReport(t, rep, stdout, []string{"1MiB"})
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
