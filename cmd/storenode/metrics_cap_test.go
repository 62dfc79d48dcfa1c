package main

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/storenode/server"
)

// Issue 22, defect 9: idle connections to --metrics-listen held a descriptor each, without
// bound, until a checkpoint could open no file. The listener holds metricsConnsMax at most:
// one more is closed at once, unanswered; once one of them closes, a prober is answered
// again; the read and idle timeouts are short. Fails on b3f6c9d, which served every one.
func TestMetricsListenerRefusesPastCap(t *testing.T) {
	node, err := server.New(server.Config{Options: storenode.Options{Dir: t.TempDir()}})
	require.NoError(t, err)
	ln, err := listenMetrics("127.0.0.1:0")
	require.NoError(t, err)
	m := startMetrics(ln, false, node, slog.New(slog.DiscardHandler))
	t.Cleanup(m.close)
	require.Equal(t, metricsReadTimeout, m.srv.ReadHeaderTimeout)
	require.Equal(t, 5*time.Second, m.srv.ReadTimeout)
	require.Equal(t, 15*time.Second, m.srv.IdleTimeout)
	require.Equal(t, metricsConnsMax+1, metricsFiles("127.0.0.1:9100"), "counted in the node's descriptor budget")
	require.Zero(t, metricsFiles(""))

	addr := m.addr.String()
	idle := make([]net.Conn, metricsConnsMax)
	for i := range idle {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		idle[i] = c
	}
	// The listener accepts in arrival order: the one past the cap finds every slot held.
	extra, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer extra.Close()
	require.NoError(t, extra.SetReadDeadline(time.Now().Add(3*time.Second)))
	_, err = extra.Read(make([]byte, 1))
	var ne net.Error
	require.False(t, err != nil && errors.As(err, &ne) && ne.Timeout(), "the connection past the cap is closed, not held: %v", err)
	require.Error(t, err)
	require.GreaterOrEqual(t, ln.(*connCap).refused.Load(), uint64(1))

	// A slot freed: a prober is answered again (once the server has seen the close).
	require.NoError(t, idle[0].Close())
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	deadline := time.Now().Add(4 * time.Second)
	for {
		resp, err := client.Get("http://" + addr + "/healthz")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "answered (the node is not started)")
			break
		}
		require.True(t, time.Now().Before(deadline), "no slot freed: %v", err)
	}
}
