//go:build unix

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/node"
)

// clusterUp is a `weft cluster up` child process and the settings it printed.
type clusterUp struct {
	cmd  *exec.Cmd
	env  map[string]string
	exit chan error
	out  chan string // the lines after the settings
}

// startClusterUp re-executes the test binary as `weft cluster up args...` and waits for
// its settings.
func startClusterUp(t *testing.T, ctx context.Context, args ...string) *clusterUp {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	a, err := json.Marshal(append([]string{"cluster", "up"}, args...))
	require.NoError(t, err)
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), childArgsEnv+"="+string(a))
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	c := &clusterUp{cmd: cmd, env: map[string]string{}, exit: make(chan error, 1), out: make(chan string, 16)}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
		}
	})
	ready := make(chan error, 1)
	go func() {
		br := bufio.NewScanner(stdout)
		up := false
		for br.Scan() {
			line := br.Text()
			if kv, ok := strings.CutPrefix(line, "export "); ok && !up {
				k, v, _ := strings.Cut(kv, "=")
				c.env[k] = v
			}
			if strings.HasPrefix(line, "weft cluster: up;") && !up {
				up = true
				ready <- nil
				continue
			}
			if up {
				select {
				case c.out <- line:
				default:
				}
			}
		}
		io.Copy(io.Discard, stdout)
		if !up {
			ready <- io.ErrUnexpectedEOF
		}
		c.exit <- cmd.Wait()
	}()
	select {
	case err := <-ready:
		require.NoError(t, err, "the cluster did not come up")
	case <-ctx.Done():
		require.FailNow(t, "the cluster did not come up in time")
	}
	return c
}

// stop sends SIGTERM and requires a clean exit (0), within ctx.
func (c *clusterUp) stop(t *testing.T, ctx context.Context) {
	t.Helper()
	require.NoError(t, c.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-c.exit:
		require.NoError(t, err, "weft cluster up exited with an error")
	case <-ctx.Done():
		require.FailNow(t, "weft cluster up did not stop on SIGTERM")
	}
	// The process is gone: signalling it fails.
	require.ErrorIs(t, c.cmd.Process.Signal(syscall.Signal(0)), os.ErrProcessDone)
}

// openNode joins the cluster with the settings `weft cluster up` printed, as a game server
// would.
func (c *clusterUp) openNode(t *testing.T, ctx context.Context, owner uint64) *node.Node {
	t.Helper()
	secret, err := os.ReadFile(c.env["WEFT_SECRET_FILE"])
	require.NoError(t, err)
	n, err := node.Open(ctx, node.Config{
		Etcd:    cluster.Config{Endpoints: strings.Split(c.env["WEFT_ETCD"], ","), Prefix: c.env["WEFT_ETCD_PREFIX"]},
		Session: cluster.SessionConfig{Owner: owner, Addr: "game:7000"},
		Secret:  []byte(strings.TrimSpace(string(secret))),
	})
	require.NoError(t, err)
	return n
}

// TestClusterUp: `weft cluster up` on a fresh directory serves a partitioned table over its
// storage nodes to a cluster node that uses only what it printed; SIGTERM stops it cleanly
// (exit 0, no process left); a restart on the same directory serves the same rows at the
// same addresses.
func TestClusterUp(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := filepath.Join(t.TempDir(), "cluster")
	c := startClusterUp(t, ctx, "--dir", dir, "--storage-nodes", "2", "--sync", "none")
	nodes := strings.Split(c.env["WEFT_STORAGE_NODES"], ",")
	require.Len(t, nodes, 2)
	fi, err := os.Stat(c.env["WEFT_SECRET_FILE"])
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())

	n := c.openNode(t, ctx, 0x51)
	tb, err := n.CreateTable(ctx, "acct", 64, 4, 1, nodes)
	require.NoError(t, err)
	require.NoError(t, tb.Own(ctx, 0, 1, 2, 3))
	rows := map[uint64]byte{}
	for i := range 40 {
		row := make([]byte, 64)
		row[0] = byte(i)
		id, err := tb.Insert(ctx, row)
		require.NoError(t, err)
		rows[id] = byte(i)
	}
	buf := make([]byte, 64)
	for id, v := range rows {
		require.NoError(t, tb.Get(ctx, id, buf))
		require.Equal(t, v, buf[0])
	}
	seen := map[string]bool{}
	for _, st := range tb.Stats() {
		seen[st.Node] = true
	}
	require.Len(t, seen, 2, "the partitions are on both storage nodes")
	require.NoError(t, n.Close(ctx))
	c.stop(t, ctx)

	// A restart reuses the directory: the same addresses, the map, the rows.
	c2 := startClusterUp(t, ctx, "--dir", dir)
	require.Equal(t, c.env, c2.env)
	n = c2.openNode(t, ctx, 0x52)
	tb, err = n.OpenTable(ctx, "acct")
	require.NoError(t, err)
	for id, v := range rows {
		require.NoError(t, tb.Get(ctx, id, buf))
		require.Equal(t, v, buf[0])
	}
	require.NoError(t, n.Close(ctx))
	c2.stop(t, ctx)
}

// TestClusterUpRefusesOtherShape: a restart asking for another number of storage nodes
// fails (the partition map names the first start's), exit 1, nothing left running.
func TestClusterUpRefusesOtherShape(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cluster")
	require.NoError(t, os.MkdirAll(dir, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "cluster.json"),
		[]byte(`{"etcd_client_port": 1, "etcd_peer_port": 2, "storage_node_ports": [3, 4]}`), 0o600))
	code, _, stderr := weft(t, "cluster", "up", "--dir", dir, "--storage-nodes", "3")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "has 2 storage nodes, not 3")
	code, _, stderr = weft(t, "cluster", "down")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "cluster up")
}
