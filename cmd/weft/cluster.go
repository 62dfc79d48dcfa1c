package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/weftdb/weft/cluster/local"
	"github.com/weftdb/weft/storenode"
)

// cluster up runs a local cluster in this process (package cluster/local): an embedded
// single-member etcd and N storage nodes on loopback, everything under --dir, until SIGINT or
// SIGTERM, then stops the storage nodes gracefully and etcd. A restart on the same --dir
// reuses the ports, the secret and the data. docs/cluster.md, "Running a local cluster".

// clusterStopTimeout bounds the graceful stop (the storage nodes checkpoint).
const clusterStopTimeout = 2 * time.Minute

func cmdCluster(ctx context.Context, g *globals, args []string, stdout io.Writer) error {
	if len(args) == 0 || args[0] != "up" {
		return fmt.Errorf("%w: the sub-command is `cluster up`", errUsage)
	}
	fs := flag.NewFlagSet("cluster up", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	dir := g.dir
	if dir == "" {
		dir = "weft-cluster"
	}
	fs.StringVar(&dir, "dir", dir, "the cluster's directory (created; a restart reuses it)")
	nodes := fs.Int("storage-nodes", 0, fmt.Sprintf("storage nodes at the first start (default %d; a restart keeps the first start's)", local.DefaultStorageNodes))
	etcdPort := fs.Int("etcd-port", 0, "etcd's client port, its peer port the next one (default: free ports picked at the first start, then kept)")
	basePort := fs.Int("port", 0, "the first storage node's port, the others the next ones (default: free ports picked at the first start, then kept)")
	syncMode := fs.String("sync", "always", "the storage nodes' WAL sync mode: always or none")
	prefix := fs.String("etcd-prefix", "", "the cluster's key prefix in etcd (/weft/ when empty)")
	logLevel := fs.String("log-level", "warn", "the storage nodes' log level on stderr: debug, info, warn or error")
	if err := fs.Parse(args[1:]); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("%w: unexpected %q", errUsage, fs.Arg(0))
	}
	sync, ok := storenode.ParseSyncMode(*syncMode)
	if !ok {
		return fmt.Errorf("%w: --sync %q: want always or none", errUsage, *syncMode)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("%w: --log-level: %v", errUsage, err)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	c, err := local.Start(ctx, local.Config{Dir: dir, StorageNodes: *nodes, EtcdPort: *etcdPort, BasePort: *basePort,
		Sync: sync, Prefix: *prefix, Logger: logger})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "weft cluster: etcd %s (prefix %s)\n", c.Etcd, c.Prefix)
	for i, a := range c.Nodes {
		fmt.Fprintf(stdout, "weft cluster: storage node %d at %s (%s)\n", i, a, c.Dirs[i])
	}
	fmt.Fprintf(stdout, "weft cluster: secrets in %s (clients: game servers), %s (storage nodes' peers), %s (operators: weft backup, moves)\n",
		c.SecretFile, c.PeerSecretFile, c.OperatorSecretFile)
	fmt.Fprintf(stdout, "# a game server's settings (node.Config; also in %s):\n", filepath.Join(filepath.Dir(c.SecretFile), "env"))
	fmt.Fprint(stdout, c.EnvScript())
	fmt.Fprintln(stdout, "weft cluster: up; Ctrl-C or SIGTERM stops it")
	var failed error
	select {
	case <-ctx.Done():
	case <-c.Failed():
		failed = errors.New("a part of the cluster stopped on its own (see the log above)")
	}
	fmt.Fprintln(stdout, "weft cluster: stopping")
	sctx, cancel := context.WithTimeout(context.Background(), clusterStopTimeout)
	defer cancel()
	err = errors.Join(failed, c.Close(sctx))
	if err == nil {
		fmt.Fprintln(stdout, "weft cluster: stopped")
	}
	return err
}
