package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/testkit"
	"github.com/weftdb/weft/sgio"
)

// The "Done when" test of issue 11: the real binary (this test binary, re-executed into main)
// runs with a low RLIMIT_NOFILE (lowered once it listens: the start-up check refuses a
// limit too low for --max-conns) and a --max-conns that fits it; authenticated sessions take
// every slot, and a flood of idle sockets, refused but kept open a while to be told why (up
// to 64 of them), drives it to EMFILE. It must keep serving its authenticated clients, answer /healthz
// with 200 throughout (on a connection opened before the flood, as a prober's keep-alive
// would be), count the accept errors, accept new clients once the flood ends, and stop cleanly.

const (
	emfileLimit    = 128 // RLIMIT_NOFILE of the child
	emfileMaxConns = 100 // + the process's own ~20 files: fits the limit, but not the refused ones that linger
)

func TestMainEMFILE(t *testing.T) {
	if args := os.Getenv("WEFT_STORENODE_EMFILE"); args != "" {
		// The start-up check (connections + tables + a margin against RLIMIT_NOFILE) would
		// refuse this --max-conns under a 128-descriptor limit: it exists so that a node does
		// not start short of descriptors. The limit is lowered once the node listens, as if
		// descriptors ran short later (tables created since, another library's files).
		lower := func(net.Addr, net.Addr) {
			var lim syscall.Rlimit
			if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
				panic(err)
			}
			lim.Cur = emfileLimit
			if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
				panic(err)
			}
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code := run(ctx, runEnv{args: strings.Fields(args), getenv: os.Getenv, stdout: os.Stdout, stderr: os.Stderr, ready: lower})
		stop()
		os.Exit(code)
	}
	if testing.Short() {
		t.Skip("re-executes the binary and floods it")
	}
	dir := t.TempDir()
	secretFile := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(secretFile, []byte(runSecret+"\n"), 0o600))
	args := fmt.Sprintf("--dir %s --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --sync none --log-format json "+
		"--max-conns %d --max-handshakes 20 --auth-timeout 1s --secret-file %s", dir, emfileMaxConns, secretFile)
	cmd := exec.Command(os.Args[0], "-test.run=^TestMainEMFILE$")
	cmd.Env = append(os.Environ(), "WEFT_STORENODE_EMFILE="+args)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	// The child's addresses, from its log; the rest of the log is kept for the end.
	addrs := make(chan [2]string, 1)
	var logMu sync.Mutex
	var logLines []string
	logDone := make(chan struct{})
	go func() {
		defer close(logDone)
		var node string
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			logMu.Lock()
			logLines = append(logLines, line)
			logMu.Unlock()
			var rec struct {
				Msg  string `json:"msg"`
				Addr string `json:"addr"`
			}
			if json.Unmarshal([]byte(line), &rec) != nil {
				continue
			}
			switch rec.Msg {
			case "storenode: listening":
				node = rec.Addr
			case "storenode: metrics listening":
				addrs <- [2]string{node, rec.Addr}
			}
		}
	}()
	var nodeAddr, metricsAddr string
	select {
	case a := <-addrs:
		nodeAddr, metricsAddr = a[0], a[1]
	case <-logDone: // the child exited before it listened
		logMu.Lock()
		defer logMu.Unlock()
		t.Fatalf("the child exited before it listened; its log:\n%s", strings.Join(logLines, "\n"))
	case <-time.After(testTimeout):
		logMu.Lock()
		defer logMu.Unlock()
		t.Fatalf("the child did not start; its log:\n%s", strings.Join(logLines, "\n"))
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dialNode := func(owner uint64) (*sgio.Client, error) {
		return sgio.Dial(ctx, sgio.ClientConfig{Addr: nodeAddr, Secret: []byte(runSecret), OwnerID: owner, DialTimeout: 5 * time.Second})
	}

	// The prober: one kept-alive HTTP connection, opened before the flood.
	probe := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1, MaxConnsPerHost: 1}, Timeout: 10 * time.Second}
	health := func() (int, string, error) {
		resp, err := probe.Get("http://" + metricsAddr + "/healthz")
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(b)), nil
	}
	code, body, err := health()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, body)

	// The legitimate clients, and the greedy ones that take the rest of --max-conns.
	const legit = 4
	var clients []*sgio.Client
	for i := range legit {
		c, err := dialNode(uint64(1 + i))
		require.NoError(t, err)
		clients = append(clients, c)
	}
	// Every slot taken: the flood is then refused, and the refused connections linger (up to
	// 64) to be told why, which the file limit does not leave room for.
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", cmd.Process.Pid))
	require.NoError(t, err)
	greedyN := emfileMaxConns - legit
	t.Logf("the child holds %d descriptors of %d with the legitimate sessions; %d greedy sessions", len(fds), emfileLimit, greedyN)
	require.Less(t, len(fds)+greedyN, emfileLimit, "--max-conns fits the file limit")
	var greedy []*sgio.Client
	for i := range greedyN {
		c, err := dialNode(uint64(100 + i))
		require.NoError(t, err, "greedy session %d", i)
		greedy = append(greedy, c)
	}

	// The flood: idle sockets, reconnecting as the node closes them, for floodFor.
	const floodFor = 4 * time.Second
	stopFlood := testkit.FloodIdleSockets(4, 150, func() (net.Conn, error) { return net.DialTimeout("tcp", nodeAddr, time.Second) }, nil)

	// Throughout: the legitimate clients ping, the prober asks /healthz.
	var lat []time.Duration
	var healthChecks int
	deadline := time.Now().Add(floodFor)
	for time.Now().Before(deadline) {
		for _, c := range clients {
			start := time.Now()
			require.NoError(t, c.CallInto(ctx, &sgio.Ping{}, &sgio.Pong{}), "a legitimate client lost its session")
			lat = append(lat, time.Since(start))
		}
		code, body, err := health()
		require.NoError(t, err, "/healthz unreachable")
		require.Equal(t, http.StatusOK, code, "/healthz while serving: %s", body)
		healthChecks++
	}
	stopFlood()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("during the flood: %d pings, p50 %v, p99 %v, max %v; %d health checks, all 200", len(lat),
		lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1], healthChecks)

	resp, err := probe.Get("http://" + metricsAddr + "/metrics")
	require.NoError(t, err)
	metrics, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	acceptErrors := metricValue(t, string(metrics), "weft_accept_errors_total")
	t.Logf("accept errors (EMFILE) during the flood: %v", acceptErrors)
	require.Greater(t, acceptErrors, 0.0, "the flood reached the file limit")

	// After the flood the node takes new clients again.
	for _, c := range greedy {
		_ = c.Close()
	}
	var c *sgio.Client
	for range 50 {
		if c, err = dialNode(999); err == nil {
			break
		}
	}
	require.NoError(t, err, "no new client after the flood")
	require.NoError(t, c.CallInto(ctx, &sgio.Ping{}, &sgio.Pong{}))
	_ = c.Close()
	for _, c := range clients {
		require.NoError(t, c.CallInto(ctx, &sgio.Ping{}, &sgio.Pong{}))
		_ = c.Close()
	}
	code, body, err = health()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, body)
	probe.CloseIdleConnections()

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	<-logDone
	require.NoError(t, cmd.Wait(), "exit status")
	logMu.Lock()
	defer logMu.Unlock()
	log := strings.Join(logLines, "\n")
	require.Contains(t, log, "storenode: stopped")
	require.NotContains(t, log, "no longer serving")
}

// metricValue reads one unlabelled sample from a Prometheus text exposition.
func metricValue(t *testing.T, text, name string) float64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindStringSubmatch(text)
	require.NotNil(t, m, "metric %s", name)
	v, err := strconv.ParseFloat(m[1], 64)
	require.NoError(t, err)
	return v
}
