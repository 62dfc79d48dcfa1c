package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/bench"
)

// TestSmokePeers runs every engine at a tiny size through bench.Main and checks that each
// ran every workload without errors (redis only when redis-server is on PATH).
func TestSmokePeers(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	out := filepath.Join(t.TempDir(), "peers.json")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	args := []string{"--records", "5000", "--duration", "100ms", "--workers", "8", "--cache", "1MiB",
		"--sync", "none", "--quiet", "--json", out}
	code := bench.Main(ctx, program(), args, &stdout, &stderr)
	require.Zero(t, code, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	var rep bench.Report
	require.NoError(t, json.Unmarshal(b, &rep))
	engines := []string{bench.WeftEngine, "map", "pebble-nosync", "pebble-sync", "bbolt"}
	if _, err := exec.LookPath("redis-server"); err == nil {
		engines = append(engines, "redis")
	} else {
		require.Contains(t, stdout.String(), "redis skipped")
	}
	for _, e := range engines {
		for _, wl := range bench.Workloads {
			var found *bench.Result
			for i, r := range rep.Results {
				if r.Engine == e && r.Workload == wl {
					found = &rep.Results[i]
				}
			}
			require.NotNil(t, found, "%s %s", e, wl)
			require.Positive(t, found.OpsPerSec, "%s %s", e, wl)
			require.Zero(t, found.Errors, "%s %s: %s", e, wl, found.FirstError)
		}
	}
	require.Contains(t, stdout.String(), "weft ops/s divided by each peer's")
}
