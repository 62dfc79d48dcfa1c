package server

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/sgio"
)

// blockingLeases is a LeaseChecker whose calls wait until release is closed (or their
// context ends), counting the calls waiting.
type blockingLeases struct {
	release chan struct{}
	mu      sync.Mutex
	waiting int
	changed chan struct{} // a receive after each change of waiting
}

func (l *blockingLeases) LeaseAlive(ctx context.Context, lease int64) (bool, error) {
	l.mu.Lock()
	l.waiting++
	l.mu.Unlock()
	l.changed <- struct{}{}
	select {
	case <-l.release:
		return true, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// TestTxnDecideLeaseChecksBounded: a TxnDecide{commit} of a part the session's owner
// prepared here (this node its primary) passes the guard and checks the coordinator's lease
// in etcd (LeaseChecker) before it records the commit. Nothing bounded the lease checks
// running at once but MaxInflight per connection (1024) times MaxConns (1024): one client
// made the node send etcd as many lease checks as it had requests in flight, each held up
// to txnRequestTimeout (10 s), a goroutine each (issue 22's hostile review, defect 8).
//
// What should happen: a Decide's lease check takes a verification slot, as a grant
// registration does (a few per connection, 16 in all), and a Decide that finds none is
// refused at once (ErrBusy); Decides of the same lease share one check (storenode's
// TestTxnDecideLeaseChecksShared). Here one client decides 64 parts under 64 leases at
// once: at most a connection's slots of checks run, the rest are refused at once, and once
// the checks answer, every part can still be decided. Fails on d707e6a: 64 lease checks at
// once.
func TestTxnDecideLeaseChecksBounded(t *testing.T) {
	const decides, bound = 64, 2
	leases := &blockingLeases{release: make(chan struct{}), changed: make(chan struct{}, 2*decides)}
	release := sync.OnceFunc(func() { close(leases.release) })
	defer release() // the checks end with the test, failed or not
	env := startServer(t, func(cfg *Config) { cfg.Options.LeaseChecker = leases })
	ctx := srvCtx(t)
	const attacker = testOwner + 100
	c := env.dial(attacker)
	ti, g := srvTable(t, c, "mine", attacker)
	txn := func(i int) [16]byte { return [16]byte{0x1c, byte(i)} }
	for i := range decides {
		m := srvCommit(ti.Table, attacker, g.Epoch, g.LastSeq+1+uint64(i), []uint64{uint64(i)}, 1)
		_, err := c.PrepareTxn(ctx, &sgio.TxnPrepare{Txn: txn(i), Lease: int64(100 + i), Commit: *m})
		require.NoError(t, err)
	}

	answered := make(chan error, decides)
	for i := range decides {
		go func() {
			_, err := c.DecideTxn(ctx, txn(i), int64(100+i), sgio.TxnCommit, 1)
			answered <- err
		}()
	}
	// Every Decide either waits in a lease check or is answered (refused: busy).
	checks, busy := 0, 0
	for checks+busy < decides {
		select {
		case <-leases.changed:
			checks++
		case err := <-answered:
			require.ErrorIs(t, err, sgio.ErrBusy, "a Decide answered while the checks wait")
			busy++
		case <-ctx.Done():
			t.Fatalf("%d lease checks, %d answers", checks, busy)
		}
	}
	require.LessOrEqual(t, checks, bound, "lease checks at once for one client")
	release()
	for range checks {
		require.NoError(t, <-answered)
	}
	for i := range decides {
		d, err := c.DecideTxn(ctx, txn(i), int64(100+i), sgio.TxnCommit, 1)
		require.NoError(t, err, "Decide %d once the slots are free", i)
		require.Equal(t, sgio.TxnCommit, d)
	}
}
