package storenode

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
)

// gatedLeases is a LeaseChecker whose calls wait for release (or their context), each
// announced on started.
type gatedLeases struct {
	release chan struct{}
	started chan struct{}
	calls   atomic.Int64
}

func (l *gatedLeases) LeaseAlive(ctx context.Context, lease int64) (bool, error) {
	l.calls.Add(1)
	l.started <- struct{}{}
	select {
	case <-l.release:
		return true, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// TestTxnDecideLeaseChecksShared: concurrent Decides of one part (a coordinator's resends,
// or a client's flood of them) share one lease check: 16 Decides wait in one LeaseChecker
// call, not 16 (issue 22's hostile review, defect 8), and all learn the commit recorded.
// Fails on b3f6c9d: 16 lease checks start.
func TestTxnDecideLeaseChecksShared(t *testing.T) {
	const decides = 16
	leases := &gatedLeases{release: make(chan struct{}), started: make(chan struct{}, decides)}
	s := newTxnStore(t, Options{LeaseChecker: leases})
	joined := make(chan struct{}, decides)
	s.e.leaseChecks.joined = func() { joined <- struct{}{} }
	id := txnID(1)
	s.primaryPart(t, id, 5)
	ctx := context.Background()
	answered := make(chan error, decides)
	for range decides {
		go func() {
			d, err := s.e.DecideTxn(ctx, id, 5, base.DecisionCommit, 1)
			if err == nil && d != base.DecisionCommit {
				err = ErrTxnDecided
			}
			answered <- err
		}()
	}
	// Every Decide starts a check or joins the running one, before any answer.
	for n := 0; n < decides; n++ {
		select {
		case <-leases.started:
		case <-joined:
		case err := <-answered:
			t.Fatalf("a Decide answered (%v) while its lease check waits", err)
		}
	}
	require.Equal(t, int64(1), leases.calls.Load(), "lease checks started by %d Decides of one part", decides)
	close(leases.release)
	for range decides {
		require.NoError(t, <-answered)
	}
	require.Equal(t, TxnStatus{Prepared: true, Primary: base.DecisionCommit}, s.e.TxnStatus(id))
}
