package storenode

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
)

// stuckPeer is a TxnPeer whose primaries are all unreachable: each call waits until its
// context ends (as a dial or call to a dead address waits out TxnCallTimeout), or, once
// release is closed, fails at once. It counts calls per primary and the most in flight.
type stuckPeer struct {
	mu       sync.Mutex
	inflight int
	most     int
	calls    map[string]int
	// full is closed once want calls are in flight at once.
	want    int
	full    chan struct{}
	filled  bool
	release chan struct{}
}

func newStuckPeer(want int) *stuckPeer {
	return &stuckPeer{calls: map[string]int{}, want: want, full: make(chan struct{}), release: make(chan struct{})}
}

func (p *stuckPeer) call(ctx context.Context, primary string) error {
	p.mu.Lock()
	p.calls[primary]++
	p.inflight++
	p.most = max(p.most, p.inflight)
	if p.inflight == p.want && !p.filled {
		p.filled = true
		close(p.full)
	}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.inflight--
		p.mu.Unlock()
	}()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-p.release:
		return errors.New("unreachable")
	}
}

func (p *stuckPeer) AskTxn(ctx context.Context, primary string, id base.TxnID, lease int64) (base.Decision, error) {
	return base.DecisionNone, p.call(ctx, primary)
}

func (p *stuckPeer) ReportTxn(ctx context.Context, primary string, id base.TxnID, index uint16) error {
	return p.call(ctx, primary)
}

// One resolver pass calls distinct primaries concurrently: with four unreachable primaries
// all four calls are in flight at once (the pass costs one TxnCallTimeout, not four), a
// primary that failed is not asked again in the pass (its second transaction is skipped),
// and the bound TxnResolvePrimariesMax holds. Fails on 964dade: the calls ran one after
// another (one in flight at a time, each waiting out its timeout).
func TestTxnResolvePrimariesConcurrently(t *testing.T) {
	for _, bound := range []int{0, 2} {
		t.Run(fmt.Sprintf("max=%d", bound), func(t *testing.T) {
			const primaries = 4
			want := primaries
			if bound > 0 {
				want = bound
			}
			peer := newStuckPeer(want)
			// A timeout far beyond the test's: only the concurrency can fill the peer.
			s := newTxnStore(t, Options{TxnPeer: peer, TxnResolveAfter: time.Nanosecond, TxnCallTimeout: time.Hour,
				TxnResolvePrimariesMax: bound})
			for i := range primaries {
				s.requirePrepared(t, txnID(byte(1+i)), 5, fmt.Sprintf("10.0.0.%d:7", i+1), 1, uint64(1+i), 5)
			}
			// A second transaction of the first primary: skipped once that primary failed.
			s.requirePrepared(t, txnID(9), 5, "10.0.0.1:7", 1, 9, 5)

			done := make(chan error, 1)
			go func() { done <- s.e.ResolveTxns(context.Background()) }()
			select {
			case <-peer.full:
			case <-time.After(time.Minute):
				peer.mu.Lock()
				defer peer.mu.Unlock()
				t.Fatalf("%d calls in flight at most, want %d at once", peer.most, want)
			}
			close(peer.release)
			select {
			case err := <-done:
				require.ErrorContains(t, err, "unreachable")
			case <-time.After(time.Minute):
				t.Fatal("the pass did not end")
			}
			peer.mu.Lock()
			defer peer.mu.Unlock()
			require.Equal(t, want, peer.most, "at most the bound in flight")
			require.Equal(t, 1, peer.calls["10.0.0.1:7"], "a failed primary is skipped for the rest of the pass")
			require.Len(t, peer.calls, primaries, "every primary asked")
			for i := range primaries {
				require.True(t, s.e.TxnStatus(txnID(byte(1+i))).Prepared, "nothing decided without the primary")
			}
		})
	}
}

// A pass blocked on unreachable primaries ends when its context does (Close cancels the
// background loop's), every call in flight with it.
func TestTxnResolvePassCancelled(t *testing.T) {
	const primaries = 3
	peer := newStuckPeer(primaries)
	s := newTxnStore(t, Options{TxnPeer: peer, TxnResolveAfter: time.Nanosecond, TxnCallTimeout: time.Hour})
	for i := range primaries {
		s.requirePrepared(t, txnID(byte(1+i)), 5, fmt.Sprintf("10.0.0.%d:7", i+1), 1, uint64(1+i), 5)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.e.ResolveTxns(ctx) }()
	select {
	case <-peer.full:
	case <-time.After(time.Minute):
		t.Fatal("the calls did not start")
	}
	cancel()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(time.Minute):
		t.Fatal("the cancelled pass did not end")
	}
	peer.mu.Lock()
	defer peer.mu.Unlock()
	require.Zero(t, peer.inflight, "every call ended with the pass")
}
