package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/testkit"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/storenode/server"
)

// TestRunPeerTLSCA: over TLS with the cluster's own CA (the usual for storage nodes), the
// two-phase commit's resolver reaches another storage node only with --tls-peer-ca: it
// verified peers against the system's roots alone, so every call to a primary failed and
// transactions in doubt stayed locked until their coordinator applied a decision.
func TestRunPeerTLSCA(t *testing.T) {
	certFile, keyFile, _ := testkit.WriteCert(t) // self-signed for 127.0.0.1: its own CA
	secret := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(secret, []byte(runSecret+"\n"), 0o600))
	peerSecret := filepath.Join(t.TempDir(), "peer-secret")
	require.NoError(t, os.WriteFile(peerSecret, []byte(runPeerSecret+"\n"), 0o600))
	primary := startRun(t, []string{"--dir", t.TempDir(), "--listen", "127.0.0.1:0", "--secret-file", secret,
		"--peer-secret-file", peerSecret, "--tls-cert", certFile, "--tls-key", keyFile, "--sync", "none"}, nil)

	peer := func(args ...string) (storenode.TxnPeer, error) {
		cfg, err := parseConfig(append([]string{"--dir", t.TempDir(), "--secret-file", secret, "--peer-secret-file", peerSecret,
			"--tls-cert", certFile, "--tls-key", keyFile, "--peers", primary.server.String()}, args...), func(string) string { return "" }, io.Discard)
		require.NoError(t, err)
		sc, err := cfg.serverConfig(slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			return nil, err
		}
		p := sc.Options.TxnPeer
		t.Cleanup(func() { p.(*server.Peer).Close() })
		return p, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	id := base.TxnID{1}

	p, err := peer("--tls-peer-ca", certFile)
	require.NoError(t, err)
	d, err := p.AskTxn(ctx, primary.server.String(), id, 1)
	require.NoError(t, err, "the resolver reaches the primary over TLS with the cluster's CA")
	require.Equal(t, base.DecisionNone, d, "undecided, and no lease checker to abort")

	p, err = peer()
	require.NoError(t, err)
	_, err = p.AskTxn(ctx, primary.server.String(), id, 1)
	require.Error(t, err, "the system's roots do not know the cluster's CA")

	_, err = peer("--tls-peer-ca", keyFile)
	require.ErrorContains(t, err, "no PEM certificate")
	cfg, err := parseConfig([]string{"--dir", t.TempDir(), "--tls-peer-ca", certFile}, func(string) string { return "" }, io.Discard)
	require.NoError(t, err)
	_, err = cfg.serverConfig(slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.ErrorContains(t, err, "--tls-peer-ca needs --tls-cert")
}

// TestRunPeersFlag: --peers lists the storage nodes the resolver may dial (and a TxnPrepare
// may name as its primary); anything else is ErrUnknownPrimary, and an entry that is not
// host:port is refused at start (review defect 1).
func TestRunPeersFlag(t *testing.T) {
	serverConfig := func(args ...string) (server.Config, error) {
		cfg, err := parseConfig(append([]string{"--dir", t.TempDir()}, args...), func(string) string { return "" }, io.Discard)
		require.NoError(t, err)
		return cfg.serverConfig(slog.New(slog.NewTextHandler(io.Discard, nil)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	sc, err := serverConfig("--peers", "10.0.0.2:7000, store-3.internal:7000")
	require.NoError(t, err)
	p := sc.Options.TxnPeer.(*server.Peer)
	defer p.Close()
	require.NoError(t, p.CheckPrimary(ctx, "10.0.0.2:7000"))
	require.NoError(t, p.CheckPrimary(ctx, "store-3.internal:7000"))
	require.ErrorIs(t, p.CheckPrimary(ctx, "10.0.0.9:7000"), server.ErrUnknownPrimary)
	_, err = p.AskTxn(ctx, "10.0.0.9:7000", base.TxnID{1}, 1)
	require.ErrorIs(t, err, server.ErrUnknownPrimary, "never dialed")

	_, err = serverConfig("--peers", "10.0.0.2")
	require.ErrorContains(t, err, "--peers")
}
