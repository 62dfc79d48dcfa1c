package server

import (
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/testkit"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// Helpers the server's tests share with the engine's (storenode's harness_test.go,
// engine_test.go, identity_test.go keep their own copies: test code is not exported; what
// needs no engine is in internal/testkit).

// testGrantPages is how many id pages the tests grant a table before they write it (the
// engine refuses rows never granted); as storenode's harness_test.go.
const testGrantPages = 64

// testOwner is the owner id of tests that need one (as storenode's engine_test.go).
const testOwner = 7

// idWait bounds every wait of these tests.
const idWait = 20 * time.Second

// quietLogger drops the engine's logs: fail-stop is expected in these tests.
var quietLogger = slog.New(slog.DiscardHandler)

// openTest opens an engine in a fresh temporary directory on the OS file system.
func openTest(t testing.TB, opts storenode.Options) *storenode.Engine {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	e, err := storenode.Open(opts)
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	return e
}

// waitDurableWaiter spins (yielding) until ready reports true or the engine has a durability
// waiter (a retry or a non-owner read waiting for its LSN).
func waitDurableWaiter(t *testing.T, e *storenode.Engine, ready func() bool) {
	t.Helper()
	testkit.SpinUntil(t, idWait, "nothing waits for durability", func() bool {
		return ready() || e.WaitsForDurability()
	})
}

// readResult is what readRowAsync's read returned: whether the row came back, or the error.
type readResult struct {
	present bool
	err     error
}

// readRowAsync reads row id of table through c (one ReadPages) in a goroutine; the channel
// gets its result.
func readRowAsync(t *testing.T, c *sgio.Client, table uint32, id uint64) chan readResult {
	got := make(chan readResult, 1)
	go func() {
		var r sgio.Segments
		err := c.CallInto(srvCtx(t), &sgio.ReadPages{Wants: []base.PageWant{{Table: table, Page: id / 64, Want: 1 << (id % 64)}}}, &r)
		if err == nil {
			got <- readResult{present: r.Segments[0].Data != 0}
			return
		}
		got <- readResult{err: err}
	}()
	return got
}
