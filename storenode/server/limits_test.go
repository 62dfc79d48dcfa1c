package server

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/storenode"
)

// A server whose connections and tables cannot have their file descriptors refuses to start,
// saying which numbers do not fit.
func TestServerFileLimit(t *testing.T) {
	err := startFileLimited(t, Config{MaxConns: 1000, fileLimit: 1000})
	require.ErrorIs(t, err, ErrFileLimit)
	require.ErrorContains(t, err, "1064 connections")
	require.ErrorContains(t, err, "RLIMIT_NOFILE is 1000")

	// Exactly enough: it starts.
	startServer(t, func(cfg *Config) {
		cfg.MaxConns, cfg.EventLoops = 100, 2
		cfg.fileLimit = 100 + rejectLingerMax + uint64(loopFiles(2)) + fileMargin
	})
}

// The start-up check counts the event loops' descriptors (gnet's epoll and eventfd per loop,
// and the acceptor's): on a machine with many cores they alone exceed the fixed margin.
// Fails before the fix, which counted connections, tables and the margin only, and started.
func TestServerFileLimitCountsEventLoops(t *testing.T) {
	const loops = 256
	err := startFileLimited(t, Config{MaxConns: 100, EventLoops: loops,
		fileLimit: 100 + rejectLingerMax + fileMargin + 2*loops - 1})
	require.ErrorIs(t, err, ErrFileLimit)
	require.ErrorContains(t, err, "256 event loops")
}

// Issue 22, defect 9: the descriptors the embedding process reserves beside the server (the
// storenode binary's metrics listener and its connections) count in the start-up check: a
// limit that fits the server alone but not them refuses to start. Fails on b3f6c9d, which
// had no such count.
func TestServerFileLimitCountsReservedFiles(t *testing.T) {
	const reserved = 33
	fits := uint64(100 + rejectLingerMax + loopFiles(2) + fileMargin)
	err := startFileLimited(t, Config{MaxConns: 100, EventLoops: 2, ReservedFiles: reserved,
		fileLimit: fits + reserved - 1})
	require.ErrorIs(t, err, ErrFileLimit)
	require.ErrorContains(t, err, "33 reserved")

	startServer(t, func(cfg *Config) {
		cfg.MaxConns, cfg.EventLoops, cfg.ReservedFiles = 100, 2, reserved
		cfg.fileLimit = fits + reserved
	})
}

// startFileLimited starts a server of cfg on 127.0.0.1:0 over a fresh engine and returns
// Start's error; a server that started is shut down.
func startFileLimited(t *testing.T, cfg Config) error {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	cfg.Options = storenode.Options{Dir: t.TempDir(), Logger: quietLogger}
	srv, err := New(cfg)
	require.NoError(t, err)
	err = srv.Start()
	if err == nil {
		srv.Shutdown(srvCtx(t))
	}
	return err
}
