// Command peers runs the CRUD benchmark of package bench on Weft and on its baselines, one
// after another in one process, with the same flags, workloads and JSON schema as crudbench,
// and prints Weft's throughput over each peer's:
//
//   - map: a Go map guarded by sharded mutexes, nothing durable (the in-memory upper bound);
//   - pebble-nosync and pebble-sync: Pebble with its WAL unsynced or synced per commit;
//   - bbolt: one bbolt transaction per op (synced per --sync);
//   - redis: redis-server on a free loopback port through go-redis with pipelining (AOF
//     synced per --sync), skipped with a note when redis-server is not on PATH.
//
// Run it from this directory: go run . --records 3000000 --duration 3s
package main

import (
	"context"
	"os"
	"os/signal"

	"github.com/weftdb/weft/bench"
)

func main() {
	if bench.IsStoreChild() {
		os.Exit(bench.StoreChildMain())
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := bench.Main(ctx, program(), os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func program() bench.Program {
	return bench.Program{
		Name:  "peers",
		Pkg:   "github.com/weftdb/weft/bench/peers",
		Peers: []bench.Factory{mapFactory(), pebbleFactory(false), pebbleFactory(true), boltFactory(), redisFactory()},
	}
}
