package testkit

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weftdb/weft/internal/vfs"
)

// ErrEIO is the error a released BlockSyncs returns from the fsyncs it held, when told to fail.
var ErrEIO = errors.New("injected EIO")

// BlockSyncs makes every WAL fsync ("wal/" in the file's name) of a FaultFS wait until
// Release is called, then fail with ErrEIO when Release was told to fail. Any goroutine may
// call its methods; Release once.
type BlockSyncs struct {
	mu      sync.Mutex
	gate    chan struct{}
	fail    bool
	waiting int // fsyncs blocked so far
}

// NewBlockSyncs injects a BlockSyncs into fs (replacing any injected fault).
func NewBlockSyncs(fs *vfs.FaultFS) *BlockSyncs {
	b := &BlockSyncs{gate: make(chan struct{})}
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
			return ErrEIO
		}
		return nil
	})
	return b
}

// Release lets every held fsync, and every later one, go: failing with ErrEIO when fail is set.
func (b *BlockSyncs) Release(fail bool) {
	b.mu.Lock()
	b.fail = fail
	close(b.gate)
	b.mu.Unlock()
}

// WaitBlocked spins (yielding) until an fsync is blocked, failing the test after within.
func (b *BlockSyncs) WaitBlocked(t testing.TB, within time.Duration) {
	t.Helper()
	SpinUntil(t, within, "no fsync blocked", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.waiting > 0
	})
}
