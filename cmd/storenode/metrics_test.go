package main

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/testkit"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/storenode/server"
)

// startLoopbackMetrics serves node's metrics (no public pprof) on a free loopback port; the
// caller closes it.
func startLoopbackMetrics(t *testing.T, node *server.Server, logger *slog.Logger) *metricsServer {
	t.Helper()
	ln, err := listenMetrics("127.0.0.1:0")
	require.NoError(t, err)
	return startMetrics(ln, false, node, logger)
}

// Finding 9 of issue 11: pprof shows the command line (the data directory, the secret file's
// path) and runs profiles as long as asked. It is served on loopback only unless
// --pprof-non-loopback, and a profile or trace is bounded to profileSecondsMax.
func TestMetricsPprofBounded(t *testing.T) {
	node, err := server.New(server.Config{Options: storenode.Options{Dir: t.TempDir()}})
	require.NoError(t, err)
	get := func(base, path string) (int, string) {
		resp, err := http.Get(base + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	logs := &testkit.SyncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, nil))

	m := startLoopbackMetrics(t, node, logger)
	base := "http://" + m.addr.String()
	code, _ := get(base, "/debug/pprof/cmdline")
	require.Equal(t, http.StatusOK, code, "pprof on loopback")
	code, body := get(base, "/debug/pprof/profile?seconds=3600")
	require.Equal(t, http.StatusBadRequest, code, body)
	code, _ = get(base, "/debug/pprof/trace?seconds=31")
	require.Equal(t, http.StatusBadRequest, code)
	require.Equal(t, metricsWriteTimeout, m.srv.WriteTimeout)
	require.Greater(t, m.srv.WriteTimeout.Seconds(), float64(profileSecondsMax), "a bounded profile fits the write timeout")
	m.close()

	// A non-loopback address (every interface, reached here through loopback): no pprof.
	for _, public := range []bool{false, true} {
		ln, err := listenMetrics("0.0.0.0:0")
		require.NoError(t, err)
		m = startMetrics(ln, public, node, logger)
		_, port, _ := net.SplitHostPort(m.addr.String())
		base = "http://127.0.0.1:" + port
		code, _ = get(base, "/debug/pprof/cmdline")
		if public {
			require.Equal(t, http.StatusOK, code, "--pprof-non-loopback")
		} else {
			require.Equal(t, http.StatusNotFound, code, "no pprof on a public address")
		}
		code, _ = get(base, "/healthz")
		require.Equal(t, http.StatusServiceUnavailable, code, "not started: not healthy")
		m.close()
	}
	require.True(t, strings.Contains(logs.String(), "pprof off"), logs.String())
}
