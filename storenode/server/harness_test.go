package server

import (
	"encoding/binary"
	"errors"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/testseed"
	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/storenode"
)

// Helpers the server's tests share with the engine's (storenode's harness_test.go,
// engine_test.go, identity_test.go keep their own copies: test code is not exported).

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

// row64 builds a 64-byte row whose words are v, v+1, ...
func row64(v uint64) []byte {
	b := make([]byte, 64)
	for i := range 8 {
		binary.LittleEndian.PutUint64(b[i*8:], v+uint64(i))
	}
	return b
}

// soak reports whether WEFT_SOAK asks for a soak run.
func soak() bool { return testseed.Soak() }

// scaled returns the count of a randomised suite: short under -short, normal in CI, soak
// under WEFT_SOAK.
func scaled(short, normal, soakCount int) int { return testseed.Scaled(short, normal, soakCount) }

// envSeed returns the seed WEFT_SEED names, if any (internal/testseed).
func envSeed(t testing.TB) (uint64, bool) { return testseed.Replay(t) }

// blockSyncs makes every WAL fsync wait until release is called, then fail with EIO when fail
// is set. waiting counts fsyncs blocked.
type blockSyncs struct {
	mu      sync.Mutex
	gate    chan struct{}
	fail    bool
	waiting int
}

func newBlockSyncs(fs *vfs.FaultFS) *blockSyncs {
	b := &blockSyncs{gate: make(chan struct{})}
	fs.Inject(func(op vfs.Op) error {
		if op.Kind != vfs.OpSync || !strings.Contains(op.Name, "wal/") {
			return nil
		}
		b.mu.Lock()
		b.waiting++
		gate := b.gate
		b.mu.Unlock()
		<-gate
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.fail {
			return errEIO
		}
		return nil
	})
	return b
}

var errEIO = errors.New("injected EIO")

func (b *blockSyncs) release(fail bool) {
	b.mu.Lock()
	b.fail = fail
	close(b.gate)
	b.mu.Unlock()
}

// waitBlocked spins (yielding) until an fsync is blocked.
func (b *blockSyncs) waitBlocked(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(idWait)
	for {
		b.mu.Lock()
		n := b.waiting
		b.mu.Unlock()
		if n > 0 {
			return
		}
		require.True(t, time.Now().Before(deadline), "no fsync blocked")
		runtime.Gosched()
	}
}

// waitDurableWaiter spins (yielding) until ready reports true or the engine has a durability
// waiter (a retry or a non-owner read waiting for its LSN).
func waitDurableWaiter(t *testing.T, e *storenode.Engine, ready func() bool) {
	t.Helper()
	deadline := time.Now().Add(idWait)
	for !ready() {
		if e.WaitsForDurability() {
			return
		}
		require.True(t, time.Now().Before(deadline), "nothing waits for durability")
		runtime.Gosched()
	}
}
