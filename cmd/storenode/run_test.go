package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/testkit"
	"github.com/weftdb/weft/sgio"
)

const testTimeout = 20 * time.Second

// running is a run in a goroutine.
type running struct {
	cancel          context.CancelFunc
	code            chan int
	server, metrics net.Addr
	stderr          *testkit.SyncBuffer
}

// startRun runs the program with args and env until stopped; it fails the test if the
// program does not get ready.
func startRun(t *testing.T, args []string, env map[string]string) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, code: make(chan int, 1), stderr: &testkit.SyncBuffer{}}
	ready := make(chan struct{})
	go func() {
		r.code <- run(ctx, runEnv{
			args:   args,
			getenv: func(k string) string { return env[k] },
			stdout: io.Discard,
			stderr: r.stderr,
			ready: func(server, metrics net.Addr) {
				r.server, r.metrics = server, metrics
				close(ready)
			},
		})
	}()
	select {
	case <-ready:
	case code := <-r.code:
		t.Fatalf("run exited with %d before it was ready: %s", code, r.stderr.String())
	case <-time.After(testTimeout):
		t.Fatalf("run not ready: %s", r.stderr.String())
	}
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop ends the run as a signal would and returns its exit code.
func (r *running) stop(t *testing.T) int {
	r.cancel()
	select {
	case code, ok := <-r.code:
		if ok {
			close(r.code)
			return code
		}
		return -1
	case <-time.After(testTimeout):
		t.Fatalf("run did not stop: %s", r.stderr.String())
		return -1
	}
}

func runOnce(args []string, env map[string]string) (code int, stdout, stderr string) {
	var out, errb testkit.SyncBuffer
	code = run(context.Background(), runEnv{args: args, getenv: func(k string) string { return env[k] }, stdout: &out, stderr: &errb})
	return code, out.String(), errb.String()
}

func dial(t *testing.T, addr string, secret []byte, tlsCfg *tls.Config) *sgio.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	c, err := sgio.Dial(ctx, sgio.ClientConfig{Addr: addr, Secret: secret, OwnerID: 1, TLS: tlsCfg})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	client := &http.Client{Timeout: testTimeout}
	resp, err := client.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func TestRunServesCommitsMetricsAndStops(t *testing.T) {
	dir := t.TempDir()
	r := startRun(t, []string{"--dir", dir, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--sync", "none", "--cache", "64MiB"}, nil)
	c := dial(t, r.server.String(), nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	require.Equal(t, sgio.SyncNone, c.Hello().SyncMode)
	var ti sgio.TableInfo
	require.NoError(t, c.CallInto(ctx, &sgio.CreateTable{Name: "t", RowBytes: 64}, &ti))
	var g sgio.Grant
	require.NoError(t, c.CallInto(ctx, &sgio.Acquire{Table: ti.Table, Owner: 1}, &g))
	require.NoError(t, c.CallInto(ctx, &sgio.AllocIDs{Table: ti.Table, Owner: 1, Epoch: g.Epoch, Pages: 1}, &sgio.IDRange{}))
	row := make([]byte, 64)
	commit := &sgio.Commit{Owner: 1, Seq: 1, Fences: []base.Fence{{Table: ti.Table, Epoch: g.Epoch}},
		Segments: []base.Segment{{Table: ti.Table, RowBytes: 64, Page: 0, Data: 1, Rows: row}}}
	require.NoError(t, c.CallInto(ctx, commit, &sgio.CommitAck{}))

	base := "http://" + r.metrics.String()
	code, body := httpGet(t, base+"/metrics")
	require.Equal(t, http.StatusOK, code)
	for _, want := range []string{
		"weft_commits_total 1", "weft_rows_written_total 1", "weft_connections 1", "weft_wal_bytes_total",
		"weft_wal_syncs_total", "weft_rows_per_sync", "weft_cache_hits_total", "weft_cache_misses_total",
		"weft_dirty_pages 1", "weft_checkpoint_last_duration_seconds", "weft_rejected_frames_total 0",
		"go_goroutines", "process_resident_memory_bytes",
		// The latency histograms (fails on 429ed4f: none; issue 23 item 8): the one commit
		// counted, the WAL's fsync and the read-miss histograms exported.
		"weft_commit_latency_seconds_count 1", `weft_commit_latency_seconds_bucket{le="+Inf"} 1`,
		"weft_wal_fsync_seconds_count", "weft_read_miss_seconds_bucket",
	} {
		require.Contains(t, body, want)
	}
	code, body = httpGet(t, base+"/healthz")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ok\n", body)
	code, body = httpGet(t, base+"/debug/pprof/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "goroutine")

	require.Equal(t, exitOK, r.stop(t))
	require.Contains(t, r.stderr.String(), "storenode: stopped")
}

func TestRunFlagsFromEnvironment(t *testing.T) {
	dir := t.TempDir()
	env := map[string]string{"WEFT_DIR": dir, "WEFT_LISTEN": "127.0.0.1:0", "WEFT_SYNC": "none", "WEFT_MAX_INFLIGHT": "7",
		"WEFT_MAX_BODY": "1MiB", "WEFT_LEASE": "3s"}
	// A flag on the command line wins over its variable.
	r := startRun(t, []string{"--max-inflight", "9"}, env)
	c := dial(t, r.server.String(), nil, nil)
	h := c.Hello()
	require.Equal(t, sgio.SyncNone, h.SyncMode)
	require.Equal(t, uint32(9), h.MaxInflight)
	require.Equal(t, uint32(1<<20), h.MaxBody)
	require.Equal(t, uint32(3000), h.LeaseMillis)

	code, _, stderr := runOnce(nil, map[string]string{"WEFT_DIR": dir, "WEFT_CACHE": "lots"})
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, "WEFT_CACHE")
}

func TestRunUsageErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--dir"},
		{[]string{"--dir", dir, "--sync", "sometimes"}, "--sync"},
		{[]string{"--dir", dir, "--listen", "0.0.0.0:0"}, "non-loopback"},
		{[]string{"--dir", dir, "--tls-cert", "x.pem"}, "go together"},
		{[]string{"--dir", dir, "--max-body", "1GiB"}, "64MiB"},
		{[]string{"--dir", dir, "--log-level", "loud"}, "--log-level"},
		{[]string{"--dir", dir, "stray"}, "unexpected arguments"},
		{[]string{"--nope"}, "flag provided but not defined"},
	} {
		code, _, stderr := runOnce(tc.args, nil)
		require.Equal(t, exitUsage, code, "%v: %s", tc.args, stderr)
		require.Contains(t, stderr, tc.want, "%v", tc.args)
	}
	code, _, _ := runOnce([]string{"-h"}, nil)
	require.Equal(t, exitOK, code)
}

func TestRunVersion(t *testing.T) {
	code, stdout, _ := runOnce([]string{"-version"}, nil)
	require.Equal(t, exitOK, code)
	require.True(t, strings.HasPrefix(stdout, "storenode "), stdout)
	require.Contains(t, stdout, "go1.")
}

// TestRunDeriveOwnerSecret: --derive-owner-secret prints the owner's secret derived from
// --secret-file's (sgio.DeriveOwnerSecret), which a node of that clients' secret accepts
// for that owner id only; without --secret-file, or with no owner id, it is a usage error.
func TestRunDeriveOwnerSecret(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(secret, []byte(runSecret+"\n"), 0o600))
	code, stdout, stderr := runOnce([]string{"--derive-owner-secret", "7", "--secret-file", secret}, nil)
	require.Equal(t, exitOK, code, stderr)
	want, err := sgio.DeriveOwnerSecret([]byte(runSecret), 7)
	require.NoError(t, err)
	require.Equal(t, want+"\n", stdout)
	code, _, stderr = runOnce([]string{"--derive-owner-secret", "7"}, nil)
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, "needs --secret-file")
	code, _, _ = runOnce([]string{"--derive-owner-secret", "seven", "--secret-file", secret}, nil)
	require.Equal(t, exitUsage, code)
}

func TestRunSecretFile(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(secret, []byte(runSecret+"\n"), 0o640))
	code, _, stderr := runOnce([]string{"--dir", dir, "--secret-file", secret}, nil)
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, "chmod 600")
	require.NoError(t, os.Chmod(secret, 0o604))
	code, _, _ = runOnce([]string{"--dir", dir, "--secret-file", secret}, nil)
	require.Equal(t, exitUsage, code)

	require.NoError(t, os.Chmod(secret, 0o600))
	// With a secret, a non-loopback address is allowed; the newline is not part of it.
	r := startRun(t, []string{"--dir", dir, "--listen", "0.0.0.0:0", "--secret-file", secret}, nil)
	port := r.server.(*net.TCPAddr).Port
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	dial(t, addr, []byte(runSecret), nil)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	_, err := sgio.Dial(ctx, sgio.ClientConfig{Addr: addr, Secret: []byte(sgio.GenerateSecret()), OwnerID: 2})
	require.ErrorIs(t, err, sgio.ErrAuthFailed)

	// A weak secret is refused at start-up, with a pointer to -gen-secret.
	weak := filepath.Join(t.TempDir(), "weak")
	require.NoError(t, os.WriteFile(weak, []byte("topsecret-123\n"), 0o600))
	code, _, stderr = runOnce([]string{"--dir", t.TempDir(), "--secret-file", weak}, nil)
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, "gen-secret")
}

// runSecret is a valid secret (hex of 16 random bytes); runPeerSecret and runOperatorSecret
// are the other roles' (--peer-secret-file, --operator-secret-file).
const (
	runSecret         = "7d2f9c0b8e1a4536b2c9d0e1f2a3b4c5"
	runPeerSecret     = "3e8a1f6c0d9b4725a6c3e0f1d2b9a8c7"
	runOperatorSecret = "b5c4d3e2f1a09f8e7d6c5b4a39281706"
)

// TestRunRoleSecretFiles: --peer-secret-file and --operator-secret-file are checked as
// --secret-file is (mode 0600, a valid secret, distinct from the others), and each secret
// dials in as its role: the clients' cannot back up, the operators' can.
func TestRunRoleSecretFiles(t *testing.T) {
	write := func(name, text string, mode os.FileMode) string {
		p := filepath.Join(t.TempDir(), name)
		require.NoError(t, os.WriteFile(p, []byte(text+"\n"), mode))
		return p
	}
	secret, peer, op := write("secret", runSecret, 0o600), write("peer", runPeerSecret, 0o600), write("op", runOperatorSecret, 0o600)
	code, _, stderr := runOnce([]string{"--dir", t.TempDir(), "--secret-file", secret, "--peer-secret-file", write("p", runPeerSecret, 0o640)}, nil)
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, "--peer-secret-file")
	require.Contains(t, stderr, "chmod 600")
	code, _, stderr = runOnce([]string{"--dir", t.TempDir(), "--secret-file", secret, "--operator-secret-file", write("o", "weak", 0o600)}, nil)
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, "--operator-secret-file")
	code, _, stderr = runOnce([]string{"--dir", t.TempDir(), "--secret-file", secret, "--operator-secret-file", secret}, nil)
	require.NotEqual(t, exitOK, code)
	require.Contains(t, stderr, "same secret")

	r := startRun(t, []string{"--dir", t.TempDir(), "--listen", "127.0.0.1:0", "--secret-file", secret,
		"--peer-secret-file", peer, "--operator-secret-file", op, "--sync", "none"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	for _, c := range []struct {
		secret string
		want   error
	}{{runSecret, sgio.ErrForbidden}, {runPeerSecret, sgio.ErrForbidden}, {runOperatorSecret, nil}} {
		cl, err := sgio.Dial(ctx, sgio.ClientConfig{Addr: r.server.String(), Secret: []byte(c.secret)})
		require.NoError(t, err)
		var chunk sgio.BackupChunk
		err = cl.CallInto(ctx, &sgio.Backup{}, &chunk)
		if c.want == nil {
			require.NoError(t, err)
		} else {
			require.ErrorIs(t, err, c.want)
		}
		require.NoError(t, cl.Close())
	}
}

func TestRunGenSecret(t *testing.T) {
	code, stdout, _ := runOnce([]string{"-gen-secret"}, nil)
	require.Equal(t, exitOK, code)
	key, err := sgio.ParseSecret([]byte(stdout))
	require.NoError(t, err)
	require.Len(t, key, 32)
	_, again, _ := runOnce([]string{"-gen-secret"}, nil)
	require.NotEqual(t, stdout, again)
}

func TestRunTLS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, pool := testkit.WriteCert(t)
	r := startRun(t, []string{"--dir", dir, "--listen", "127.0.0.1:0", "--tls-cert", certFile, "--tls-key", keyFile, "--sync", "none"}, nil)
	c := dial(t, r.server.String(), nil, &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	require.NoError(t, c.CallInto(ctx, &sgio.Ping{}, &sgio.Pong{}))
}

func TestByteSize(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "4096": 4096, "64KiB": 64 << 10, "512MiB": 512 << 20, "4GiB": 4 << 30,
		"2g": 2 << 30, "1T": 1 << 40, "8 MB": 8 << 20} {
		var b byteSize
		require.NoError(t, b.Set(in), in)
		require.Equal(t, want, int64(b), in)
	}
	for _, in := range []string{"", "lots", "-1", "1.5GiB", "1PiB", "99999999999TiB"} {
		var b byteSize
		require.Error(t, b.Set(in), in)
	}
	b := byteSize(3 << 30)
	require.Equal(t, "3GiB", b.String())
}

// TestMainSIGTERM runs the real main in a child process (this test binary, re-executed) and
// stops it with SIGTERM: it checkpoints and exits 0.
func TestMainSIGTERM(t *testing.T) {
	if os.Getenv("WEFT_STORENODE_MAIN") != "" {
		os.Args = append([]string{"storenode"}, strings.Fields(os.Getenv("WEFT_STORENODE_MAIN"))...)
		main()
		return
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestMainSIGTERM$")
	cmd.Env = append(os.Environ(), "WEFT_STORENODE_MAIN=--dir "+dir+" --listen 127.0.0.1:0 --log-format json")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	waitLine := func(want string) {
		t.Helper()
		timer := time.NewTimer(testTimeout)
		defer timer.Stop()
		for {
			select {
			case l, ok := <-lines:
				require.True(t, ok, "child exited before logging %q", want)
				if strings.Contains(l, want) {
					return
				}
			case <-timer.C:
				t.Fatalf("no %q in the child's log", want)
			}
		}
	}
	waitLine("storenode: listening")
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	waitLine("storenode: stopped")
	for range lines {
	}
	require.NoError(t, cmd.Wait(), "exit status")
	require.FileExists(t, filepath.Join(dir, "meta"), "checkpointed at shutdown")
}

// A storage node that cannot start for a reason known before it touches the disk (its
// address or its metrics address in use, too few file descriptors for --max-conns, bad flags,
// a weak secret, a non-loopback address without one) exits without creating its directory,
// and leaves an existing store's files as they were. Fails on 767c454 for the addresses in
// use and the file limit: the engine was opened (directory, lock, meta file, a WAL segment)
// before the listener was bound.
func TestRunFailedStartLeavesNothingBehind(t *testing.T) {
	// A start that wrongly succeeds serves until the context ends: bounded, it then fails
	// the test on its exit code instead of hanging.
	runFailing := func(args []string) (int, string) {
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		var errb testkit.SyncBuffer
		code := run(ctx, runEnv{args: args, getenv: func(string) string { return "" }, stdout: io.Discard, stderr: &errb})
		return code, errb.String()
	}
	held, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer held.Close()
	secrets := t.TempDir()
	weak := filepath.Join(secrets, "weak")
	require.NoError(t, os.WriteFile(weak, []byte("0123456789abcdef\n"), 0o600))
	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"listen address in use", []string{"--listen", held.Addr().String()}, exitFailure, "address already in use"},
		{"metrics address in use", []string{"--listen", "127.0.0.1:0", "--metrics-listen", held.Addr().String()}, exitFailure, "address already in use"},
		{"file limit", []string{"--listen", "127.0.0.1:0", "--max-conns", "1099511627776"}, exitFailure, "RLIMIT_NOFILE"},
		{"bad flag", []string{"--listen", "127.0.0.1:0", "--sync", "sometimes"}, exitUsage, "--sync"},
		{"weak secret", []string{"--listen", "127.0.0.1:0", "--secret-file", weak}, exitUsage, "--secret-file"},
		{"non-loopback without a secret", []string{"--listen", "0.0.0.0:0"}, exitUsage, "non-loopback"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "store")
			code, stderr := runFailing(append([]string{"--dir", dir}, tc.args...))
			require.Equal(t, tc.code, code, stderr)
			require.Contains(t, stderr, tc.want)
			_, err := os.Lstat(dir)
			require.True(t, os.IsNotExist(err), "the failed start created %s: %v", dir, err)
		})
	}

	// A store that served once, then a start that fails: every file as it was.
	dir := filepath.Join(t.TempDir(), "store")
	r := startRun(t, []string{"--dir", dir, "--listen", "127.0.0.1:0"}, nil)
	require.Equal(t, exitOK, r.stop(t))
	before := testkit.TreeState(t, dir)
	require.NotEmpty(t, before)
	for _, tc := range cases {
		code, stderr := runFailing(append([]string{"--dir", dir}, tc.args...))
		require.Equal(t, tc.code, code, "%s: %s", tc.name, stderr)
		require.Equal(t, before, testkit.TreeState(t, dir), tc.name)
	}
}
