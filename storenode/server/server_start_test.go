package server

import (
	"crypto/tls"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/weftdb/weft/internal/testkit"
	"github.com/weftdb/weft/storenode"
)

// dirState is what a test compares of a directory tree: every entry's mode, size, time and,
// for a file, a hash of its content; nil when the directory does not exist.
func dirState(t *testing.T, dir string) map[string]string {
	t.Helper()
	if _, err := os.Lstat(dir); os.IsNotExist(err) {
		return nil
	}
	return testkit.TreeState(t, dir)
}

// A server that cannot start for a reason known before the disk is touched (its address in
// use, too few file descriptors) creates no store directory and leaves an existing one as
// it was. Fails on 767c454: Start opened the engine first, which created the directory, the
// lock file, the meta file and a WAL segment.
func TestStartFailureLeavesNothingBehind(t *testing.T) {
	// A failed start leaves nothing running either (gnet's ants workers are a pool).
	leakOpts := []goleak.Option{goleak.IgnoreCurrent(), goleak.IgnoreTopFunction("github.com/panjf2000/ants/v2.(*goWorker).run.func1")}
	t.Cleanup(func() { goleak.VerifyNone(t, leakOpts...) })
	held, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer held.Close()
	cases := []struct {
		name string
		mod  func(*Config)
		want error
	}{
		{"address in use", func(c *Config) { c.Listen = held.Addr().String() }, syscall.EADDRINUSE},
		{"address in use with TLS", func(c *Config) {
			c.Listen = held.Addr().String()
			c.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
		}, syscall.EADDRINUSE},
		{"file limit", func(c *Config) { c.MaxConns, c.fileLimit = 1000, 1000 }, ErrFileLimit},
	}
	start := func(dir string, mod func(*Config)) error {
		cfg := Config{Listen: "127.0.0.1:0", EventLoops: 1, Logger: quietLogger,
			Options: storenode.Options{Dir: dir, Logger: quietLogger, CheckpointInterval: -1}}
		if mod != nil {
			mod(&cfg)
		}
		srv, err := New(cfg)
		require.NoError(t, err)
		err = srv.Start()
		if err == nil {
			require.NoError(t, srv.Shutdown(t.Context()))
		}
		return err
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "parent", "store")
			err := start(dir, tc.mod)
			require.ErrorIs(t, err, tc.want)
			if tc.want == syscall.EADDRINUSE && runtime.GOOS == "linux" {
				require.Contains(t, err.Error(), fmt.Sprintf(": held by process %d ", os.Getpid()), "the error names who listens there")
			}
			_, err = os.Lstat(filepath.Dir(dir))
			require.ErrorIs(t, err, fs.ErrNotExist, "nothing created, not even the parent")

			// An existing store (with a table) is left exactly as it was.
			e, err := storenode.Open(storenode.Options{Dir: dir, Logger: quietLogger, CheckpointInterval: -1})
			require.NoError(t, err)
			_, err = e.CreateTable("t", 64)
			require.NoError(t, err)
			require.NoError(t, e.Close())
			before := dirState(t, dir)
			require.NotEmpty(t, before)
			require.ErrorIs(t, start(dir, tc.mod), tc.want)
			require.Equal(t, before, dirState(t, dir))
			require.NoError(t, start(dir, nil), "the store still opens")
		})
	}
}

// A start that fails once the engine is opened (here: the store is locked by another
// engine, in this process) releases what it took before: the address is free again and, with gnet, the
// event loops are stopped (goleak).
func TestStartFailureAfterListenReleasesTheAddress(t *testing.T) {
	leakOpts := []goleak.Option{goleak.IgnoreCurrent(), goleak.IgnoreTopFunction("github.com/panjf2000/ants/v2.(*goWorker).run.func1")}
	dir := t.TempDir()
	holder, err := storenode.Open(storenode.Options{Dir: dir, Logger: quietLogger, CheckpointInterval: -1})
	require.NoError(t, err)
	defer holder.Close()
	t.Cleanup(func() { goleak.VerifyNone(t, leakOpts...) })
	for _, withTLS := range []bool{false, true} {
		probe, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := probe.Addr().String()
		require.NoError(t, probe.Close())
		cfg := Config{Listen: addr, EventLoops: 1, Logger: quietLogger,
			Options: storenode.Options{Dir: dir, Logger: quietLogger, CheckpointInterval: -1}}
		if withTLS {
			cfg.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		srv, err := New(cfg)
		require.NoError(t, err)
		// ErrLocked today; the test does not depend on how a lock held in this process is
		// worded, only on Open failing after the address was bound.
		require.Error(t, srv.Start(), "tls=%v", withTLS)
		again, err := net.Listen("tcp", addr)
		require.NoError(t, err, "tls=%v: the failed start still holds %s", withTLS, addr)
		require.NoError(t, again.Close())
		require.NoError(t, srv.Shutdown(t.Context()), "Shutdown after a failed Start")
	}
}
