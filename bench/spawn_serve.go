package bench

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"

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
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	return server.Serve(ctx, server.Config{
		Options:         storenode.Options{Dir: dir, Sync: sync, CacheBytes: cfg.CacheBytes, Logger: logger},
		Listen:          "127.0.0.1:0",
		Logger:          logger,
		OnListen:        func(a net.Addr) { ready(a.String()) },
		ShutdownTimeout: storeChildStopTimeout / 2,
	})
}
