package server

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/testseed"
	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// engineLockHold holds the engine's lock until released: a CreateTable blocks in the create
// of its data file, which it makes with the engine's lock held (so the file is made before
// anything is logged).
type engineLockHold struct {
	gate chan struct{}
	held chan struct{} // closed once the create is blocked, the lock held
	once sync.Once
	hold sync.Once
}

func newEngineLockHold(fs *vfs.FaultFS) *engineLockHold {
	h := &engineLockHold{gate: make(chan struct{}), held: make(chan struct{})}
	fs.Inject(func(op vfs.Op) error {
		if op.Kind == vfs.OpCreate && strings.HasSuffix(op.Name, ".dat") {
			h.hold.Do(func() { close(h.held) })
			<-h.gate
		}
		return nil
	})
	return h
}

// release lets the blocked create go; idempotent (a failed test's cleanup calls it too).
func (h *engineLockHold) release() { h.once.Do(func() { close(h.gate) }) }

func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(srvTestTimeout):
		t.Fatalf("%s: not within %v", what, srvTestTimeout)
	}
}

// Lease renewals are answered while the engine's lock is held (a CreateTable blocked in its
// data file's create; a forced checkpoint and the commits streamed on the owner's connection
// wait behind it): each within a quarter lease (the transaction node's renewal period;
// generous, the loop answers at once), refused ones too (ErrFenced, ErrTableNotFound), and a
// renewal answered so really extends the lease (a fake clock: another owner is refused two
// leases past the grant). Fails on 3d9139f: the renewal went to a goroutine that waited for
// the engine's lock (renew, then Acquire) until the create ended.
func TestServerRenewalDuringEngineLock(t *testing.T) {
	fs := vfs.NewFaultFS()
	var clock *fakeClock
	env := startServer(t, func(cfg *Config) { cfg.Options.Dir, cfg.Options.FS = "db", fs }, withClock(&clock))
	lease := storenode.DefaultLeaseDuration
	owner := env.dial(5)
	ti, g := srvTable(t, owner, "t", 5)
	require.NoError(t, owner.CallInto(srvCtx(t), srvCommit(ti.Table, 5, g.Epoch, 1, []uint64{1}, 11), &sgio.CommitAck{}))

	hold := newEngineLockHold(fs)
	t.Cleanup(hold.release) // before the server's stop (cleanups run last first)
	creator := env.dial(0)
	created := make(chan error, 1)
	go func() {
		created <- creator.CallInto(srvCtx(t), &sgio.CreateTable{Name: "u", RowBytes: 64}, &sgio.TableInfo{})
	}()
	waitClosed(t, hold.held, "the create of the new table's data file")
	ckptDone := make(chan error, 1)
	go func() { ckptDone <- env.srv.Engine().Checkpoint() }()

	// Commits on the owner's connection, stalled behind the engine's lock.
	commits := testseed.Scaled(16, 64, 256)
	acks := make(chan error, commits)
	for i := range commits {
		m := srvCommit(ti.Table, 5, g.Epoch, 2+uint64(i), []uint64{uint64(200 + i)}, uint64(i))
		require.NoError(t, owner.Send(srvCtx(t), m, func(_ sgio.Frame, err error) { acks <- err }))
	}

	renew := func(table uint32, epoch uint64) (sgio.Grant, error) {
		ctx, cancel := context.WithTimeout(context.Background(), lease/4)
		defer cancel()
		var r sgio.Grant
		err := owner.CallInto(ctx, &sgio.Acquire{Table: table, Owner: 5, Epoch: epoch}, &r)
		return r, err
	}
	for range testseed.Scaled(4, 8, 32) {
		clock.Advance(lease / 2)
		r, err := renew(ti.Table, g.Epoch)
		require.NoError(t, err, "a renewal while the engine's lock is held")
		require.Equal(t, g.Epoch, r.Epoch)
		require.Equal(t, uint64(1), r.LastSeq, "the owner's last applied seq, as a new grant reports it")
	}
	_, err := renew(ti.Table, g.Epoch+1)
	require.ErrorIs(t, err, sgio.ErrFenced)
	_, err = renew(ti.Table+100, g.Epoch)
	require.ErrorIs(t, err, sgio.ErrTableNotFound)
	require.Empty(t, created, "the create is held")
	if len(acks) > 0 {
		t.Fatalf("a commit finished while the engine's lock was held: %v", <-acks)
	}

	hold.release()
	require.NoError(t, <-created)
	require.NoError(t, <-ckptDone)
	for range commits {
		require.NoError(t, <-acks)
	}
	// The clock ran two leases past the grant: the renewals (and the traffic, renewed on the
	// loop too) kept it.
	other := env.dial(6)
	err = other.CallInto(srvCtx(t), &sgio.Acquire{Table: ti.Table, Owner: 6}, &sgio.Grant{})
	require.ErrorIs(t, err, sgio.ErrOwned)
	fs.Inject(nil)
}
