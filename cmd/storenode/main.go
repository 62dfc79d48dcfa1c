// Command storenode runs a Weft storage node: the durable copy of a set of tables, served over
// sgio on TCP (gnet, or TLS). docs/operations.md documents every flag, its environment
// variable, the metrics and what to back up.
//
//	storenode -dir /var/lib/weft
//
// It stops gracefully on SIGINT or SIGTERM: it stops accepting, finishes the batches in flight,
// checkpoints and exits 0.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, runEnv{args: os.Args[1:], getenv: os.Getenv, stdout: os.Stdout, stderr: os.Stderr})
	stop()
	os.Exit(code)
}
