package bench

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/local"

	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/storenode/server"
)

// serveStore runs a storage node in dir on a free loopback port until ctx ends, calling ready
// with its address once it listens; it returns nil after a clean shutdown (batches finished,
// checkpoint written, engine closed).
func serveStore(ctx context.Context, dir string, cfg storeChildConfig, ready func(addr string)) error {
	sync, ok := storenode.ParseSyncMode(cfg.Sync)
	if !ok {
		return fmt.Errorf("sync mode %q: want always or none", cfg.Sync)
	}
	logger := warnLogger()
	opts := storenode.Options{Dir: dir, Sync: sync, CacheBytes: cfg.CacheBytes, Logger: logger}
	var secrets [3][]byte // the clients', the peers', the operators' (docs/operations.md, "Roles and credentials")
	for i, name := range []string{cfg.SecretFile, cfg.PeerSecretFile, cfg.OperatorSecretFile} {
		if name == "" {
			continue
		}
		b, err := os.ReadFile(name)
		if err != nil {
			return fmt.Errorf("secret: %w", err)
		}
		secrets[i] = bytes.TrimSpace(b)
	}
	if cfg.Etcd != "" {
		// As cmd/storenode -etcd: grants verified in etcd, coordinators' leases read there,
		// other storage nodes reached (with the peers' secret) as the primaries of prepared
		// transactions.
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		cli, err := cluster.Connect(cctx, cluster.Config{Endpoints: []string{cfg.Etcd}, Logger: logger})
		cancel()
		if err != nil {
			return fmt.Errorf("etcd: %w", err)
		}
		defer cli.Close()
		peer := local.WireEtcd(&opts, cli, server.PeerConfig{Secret: secrets[1], Name: "crudbench-resolver"})
		defer peer.Close() // after Serve returned: the storage node has stopped
	}
	return server.Serve(ctx, server.Config{
		Secret: secrets[0], PeerSecret: secrets[1], OperatorSecret: secrets[2],
		Options:         opts,
		Listen:          "127.0.0.1:0",
		Logger:          logger,
		OnListen:        func(a net.Addr) { ready(a.String()) },
		ShutdownTimeout: storeChildStopTimeout / 2,
	})
}
