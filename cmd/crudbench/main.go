// Command crudbench measures Weft's CRUD throughput: the source article's table (insert,
// update and query with random and sequential ids, at a 1 MiB and a 1 GiB txn-node cache),
// plus delete and a zipfian 80/20 get/update mix. Workloads, histograms and reports live in
// package bench; run with -h for the flags. By default the storage engine is embedded in a
// temporary directory, removed at the end; --store uses a running storage node and
// --spawn-store starts one in a child process (this binary again).
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
	code := bench.Main(ctx, bench.Program{Name: "crudbench", Pkg: "github.com/weftdb/weft/cmd/crudbench"}, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
