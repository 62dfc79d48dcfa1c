package local

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// startOne starts a one-storage-node local cluster in dir with prefix.
func startOne(t *testing.T, ctx context.Context, dir, prefix string) (*Cluster, error) {
	t.Helper()
	c, err := Start(ctx, Config{Dir: dir, StorageNodes: 1, Sync: storenode.SyncNone, Prefix: prefix,
		Logger: slog.New(slog.DiscardHandler)})
	if err == nil {
		t.Cleanup(func() { _ = c.Close(context.Background()) })
	}
	return c, err
}

// TestEnvFileSourced: Dir/env, sourced by a shell from another directory, gives the
// settings Env returns, with the secret file's absolute path, whatever characters the
// directory's name holds (a space, a quote, a $). The file used to hold the values
// unquoted and the secret file's path relative to the directory `weft cluster up` ran in.
func TestEnvFileSourced(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	root := t.TempDir()
	t.Chdir(root)
	dir := "a b'c$HOME"
	c, err := startOne(t, ctx, dir, "")
	require.NoError(t, err)
	abs := filepath.Join(root, dir, "secret")
	require.Equal(t, abs, c.SecretFile)

	cmd := exec.CommandContext(ctx, sh, "-c", `. "$1" && env`, "sh", filepath.Join(root, dir, "env"))
	cmd.Dir = t.TempDir() // elsewhere
	out, err := cmd.Output()
	require.NoError(t, err)
	got := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && strings.HasPrefix(k, "WEFT_") {
			got[k] = v
		}
	}
	for _, kv := range c.Env() {
		k, v, _ := strings.Cut(kv, "=")
		require.Equal(t, v, got[k], k)
	}
	b, err := os.ReadFile(got["WEFT_SECRET_FILE"])
	require.NoError(t, err)
	require.Equal(t, string(c.Secret), strings.TrimSpace(string(b)))
	require.NoError(t, c.Close(ctx))
}

// TestRestartKeepsPrefix: the etcd prefix is the cluster's, kept in Dir as the ports are: a
// restart with another prefix is refused (its partition map is under the first), one with
// none takes the first. It used to start with the other prefix, an empty cluster over the
// storage nodes' tables.
func TestRestartKeepsPrefix(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	c, err := startOne(t, ctx, dir, "/game/")
	require.NoError(t, err)
	require.Equal(t, "/game/", c.Prefix)
	require.NoError(t, c.Close(ctx))

	_, err = startOne(t, ctx, dir, "/other/")
	require.ErrorContains(t, err, "/game/")
	c, err = startOne(t, ctx, dir, "")
	require.NoError(t, err)
	require.Equal(t, "/game/", c.Prefix)
	require.Contains(t, c.Env(), "WEFT_ETCD_PREFIX=/game/")
	require.NoError(t, c.Close(ctx))
}

// TestLoadLayoutBounded: a cluster.json over layoutBytesMax is refused before it is read
// whole, even one that would decode (padded); it used to be read and accepted whatever
// its size.
func TestLoadLayoutBounded(t *testing.T) {
	dir := t.TempDir()
	b := []byte(`{"etcd_client_port": 2379, "etcd_peer_port": 2380, "storage_node_ports": [7070]}`)
	b = append(b, strings.Repeat(" ", layoutBytesMax)...)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "cluster.json"), b, 0o600))
	_, err := loadLayout(Config{Dir: dir})
	require.ErrorContains(t, err, "cluster.json: damaged: over")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "cluster.json"), b[:len(b)-layoutBytesMax+100], 0o600))
	lay, err := loadLayout(Config{Dir: dir})
	require.NoError(t, err)
	require.Equal(t, []int{7070}, lay.NodePorts)
}

// TestSecondStartOnDirRefused: a second Start on the Dir of a running cluster fails, saying
// so, and leaves the first one serving with its files as they were.
func TestSecondStartOnDirRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	c, err := startOne(t, ctx, dir, "")
	require.NoError(t, err)
	before, err := os.ReadFile(filepath.Join(dir, "cluster.json"))
	require.NoError(t, err)
	_, err = startOne(t, ctx, dir, "")
	require.ErrorContains(t, err, "running already")
	after, err := os.ReadFile(filepath.Join(dir, "cluster.json"))
	require.NoError(t, err)
	require.Equal(t, before, after)
	select {
	case <-c.Failed():
		t.Fatal("the first cluster failed")
	default:
	}
	require.NoError(t, c.Close(ctx))
}

// TestFirstStartRefusesBadPorts: ports past 65535 (--port 65535 with two storage nodes, or
// --etcd-port 65535: its peer port is the next) or colliding (the etcd peer port on the
// first storage node's) are refused at the first start and nothing is written, so a start
// with good ones works in the same Dir. They used to be written to cluster.json, which then
// refused every later start as damaged.
func TestFirstStartRefusesBadPorts(t *testing.T) {
	for _, cfg := range []Config{
		{BasePort: 65535, StorageNodes: 2},
		{EtcdPort: 65535},
		{EtcdPort: 20000, BasePort: 20001},
		{BasePort: -3},
	} {
		cfg.Dir = t.TempDir()
		_, err := loadLayout(cfg)
		require.ErrorContains(t, err, "out of range or repeated", "%+v", cfg)
		_, err = os.Stat(filepath.Join(cfg.Dir, "cluster.json"))
		require.ErrorIs(t, err, os.ErrNotExist)
		lay, err := loadLayout(Config{Dir: cfg.Dir})
		require.NoError(t, err)
		require.Len(t, lay.NodePorts, DefaultStorageNodes)
	}
}

// TestRoleSecrets: a local cluster makes three secrets (clients', peers', operators'), each
// in a file of mode 0600, all different, and its storage nodes tell them apart: the clients'
// cannot back up, the operators' can. A restart reuses them.
func TestRoleSecrets(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	c, err := startOne(t, ctx, dir, "")
	require.NoError(t, err)
	files := []string{c.SecretFile, c.PeerSecretFile, c.OperatorSecretFile}
	secrets := [][]byte{c.Secret, c.PeerSecret, c.OperatorSecret}
	for i, f := range files {
		fi, err := os.Stat(f)
		require.NoError(t, err)
		if runtime.GOOS != "windows" {
			require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), f)
		}
		for j := range i {
			require.NotEqual(t, secrets[j], secrets[i])
		}
	}
	backup := func(secret []byte) error {
		cl, err := sgio.Dial(ctx, sgio.ClientConfig{Addr: c.Nodes[0], Secret: secret})
		require.NoError(t, err)
		defer cl.Close()
		return cl.CallInto(ctx, &sgio.Backup{}, &sgio.BackupChunk{})
	}
	require.ErrorIs(t, backup(c.Secret), sgio.ErrForbidden)
	require.NoError(t, backup(c.OperatorSecret))
	require.Contains(t, c.Env(), "WEFT_OPERATOR_SECRET_FILE="+c.OperatorSecretFile)
	require.NoError(t, c.Close(ctx))

	c2, err := startOne(t, ctx, dir, "")
	require.NoError(t, err)
	require.Equal(t, secrets, [][]byte{c2.Secret, c2.PeerSecret, c2.OperatorSecret}, "kept across a restart")
	require.NoError(t, c2.Close(ctx))
}
