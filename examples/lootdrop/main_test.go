package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/storenode/server"
)

func TestLootdrop(t *testing.T) {
	for _, writeBack := range []bool{false, true} {
		name := "durable"
		if writeBack {
			name = "writeback"
		}
		t.Run(name, func(t *testing.T) {
			cfg := config{dir: t.TempDir(), players: 16, items: 3000, duration: 300 * time.Millisecond,
				cacheBytes: 1 << 20, writeBack: writeBack, syncMode: "none"}
			var out bytes.Buffer
			require.NoError(t, run(context.Background(), cfg, &out))
			t.Log(out.String())
			require.Contains(t, out.String(), "items conserved: ")
			// A second run goes on with the same world.
			out.Reset()
			cfg.items = 1 // ignored: the world exists
			require.NoError(t, run(context.Background(), cfg, &out))
			require.Contains(t, out.String(), "= 3000 of 3000")
		})
	}
}

// Twice in a row against one storage node: each run has a new random owner id, and the first
// run's Close releases the tables, so the second takes them at once. Fails on 767c454, where
// the second run met ErrTableOwned for the rest of the first run's lease.
func TestLootdropTwiceOnStorageNode(t *testing.T) {
	srv, err := server.New(server.Config{Listen: "127.0.0.1:0",
		Options: storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone}})
	require.NoError(t, err)
	require.NoError(t, srv.Start())
	defer func() { require.NoError(t, srv.Shutdown(context.Background())) }()
	cfg := config{store: srv.Addr().String(), players: 8, items: 500, duration: 200 * time.Millisecond,
		cacheBytes: 1 << 20}
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), cfg, &out))
	out.Reset()
	require.NoError(t, run(context.Background(), cfg, &out), "the second run")
	require.Contains(t, out.String(), "= 500 of 500")
}

// TestLootdropWithRoles: against a storage node with the three roles' secrets, the game
// server plays with the clients' secret (-secret-file), twice in a row.
func TestLootdropWithRoles(t *testing.T) {
	secret := []byte(sgio.GenerateSecret())
	srv, err := server.New(server.Config{Listen: "127.0.0.1:0", Secret: secret,
		PeerSecret: []byte(sgio.GenerateSecret()), OperatorSecret: []byte(sgio.GenerateSecret()),
		Options: storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone}})
	require.NoError(t, err)
	require.NoError(t, srv.Start())
	defer func() { require.NoError(t, srv.Shutdown(context.Background())) }()
	file := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(file, append(secret, '\n'), 0o600))
	cfg := config{store: srv.Addr().String(), secretFile: file, players: 8, items: 500, duration: 200 * time.Millisecond,
		cacheBytes: 1 << 20}
	for range 2 {
		var out bytes.Buffer
		require.NoError(t, run(context.Background(), cfg, &out))
		require.Contains(t, out.String(), "= 500 of 500")
	}
	require.Zero(t, srv.Stats().ForbiddenRequests)
}

func TestLootdropStoreAddr(t *testing.T) {
	// Nothing listens there: Open fails and run says so (whether or not the remote store is
	// in this build).
	cfg := config{store: "127.0.0.1:1", players: 1, items: 1, duration: time.Millisecond}
	err := run(context.Background(), cfg, &bytes.Buffer{})
	require.ErrorContains(t, err, "open")
}
