package storenode

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
)

// answeringPeer is a stuckPeer but for one primary, which answers at once (undecided); it
// notes how many calls to the others had begun when that primary was first asked.
type answeringPeer struct {
	*stuckPeer
	answers string
	asked   chan struct{}
	before  int // calls to the others begun before answers' first ask; -1 until then
}

func (p *answeringPeer) AskTxn(ctx context.Context, primary string, id base.TxnID, lease int64) (base.Decision, error) {
	if primary != p.answers {
		return p.stuckPeer.AskTxn(ctx, primary, id, lease)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.before < 0 {
		p.before = 0
		for _, n := range p.calls {
			p.before += n
		}
		close(p.asked)
	}
	p.calls[primary]++
	return base.DecisionNone, nil
}

// callsSince reports the calls per primary since the last callsSince.
func (p *answeringPeer) callsSince() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.calls
	p.calls = map[string]int{}
	return c
}

// TestTxnResolveFairOverOwnersAndBacksOff: one owner's parts naming 300 unresponsive
// primaries (addresses sorting first) do not hold up another owner's part: the pass takes
// the owners' parts in turn (the other owner's part is in the pass whatever the first
// owner's count) and its primary is among the first runs started (asked before the bound's
// worth of calls to the unresponsive ones are in flight). A primary whose run failed is
// skipped until its backoff ends (engine clock), and after it a pass retries only
// txnProbesMax of them. Fails on b3f6c9d: the runs start in address order, the other
// owner's primary last (the 2 slots held by the unresponsive primaries, it is never
// asked), and failed primaries are asked again in the next pass.
func TestTxnResolveFairOverOwnersAndBacksOff(t *testing.T) {
	const hangs, slots, real = 300, 2, "10.9.0.1:7"
	clock := &fakeClock{}
	peer := &answeringPeer{stuckPeer: newStuckPeer(slots), answers: real, asked: make(chan struct{}), before: -1}
	s := newTxnStore(t, Options{TxnPeer: peer, TxnResolveAfter: time.Second, TxnCallTimeout: time.Hour,
		TxnResolvePrimariesMax: slots, MaxTxnsPerOwner: 2 * hangs, Now: clock.Now})
	for i := range hangs {
		id := base.TxnID{0: 0x7f, 14: byte(i >> 8), 15: byte(i)}
		s.requirePrepared(t, id, 5, fmt.Sprintf("10.0.%d.%d:7", i/256, i%256), 1, uint64(1+i), 5)
	}
	other := ownerStore(t, s.e, "other", testOwner+1)
	other.requirePrepared(t, txnID(1), 5, real, 1, 1, 5)
	clock.Advance(time.Second)

	ctx := context.Background()
	done := make(chan error, 1)
	go func() { done <- s.e.ResolveTxns(ctx) }()
	select {
	case <-peer.asked:
	case <-peer.full:
	case <-time.After(time.Minute):
		t.Fatal("neither asked")
	}
	peer.mu.Lock()
	before := peer.before
	peer.mu.Unlock()
	require.GreaterOrEqual(t, before, 0, "the other owner's primary is asked before the unresponsive ones fill the slots")
	require.Less(t, before, slots)
	close(peer.release) // the unresponsive ones now fail at once
	select {
	case err := <-done:
		require.ErrorContains(t, err, "unreachable")
	case <-time.After(time.Minute):
		t.Fatal("the pass did not end")
	}
	first := peer.callsSince()
	require.Equal(t, 1, first[real])
	require.Len(t, first, txnTasksMax, "the pass's 256 tasks: the other owner's and 255 of the first owner's")

	// Same clock: the failed primaries are skipped, the 45 left out are asked.
	require.ErrorContains(t, s.e.ResolveTxns(ctx), "unreachable")
	second := peer.callsSince()
	require.Equal(t, 1, second[real])
	require.Len(t, second, hangs-(txnTasksMax-1)+1)
	for p := range second {
		if p != real {
			require.Zero(t, first[p], "%s failed in the first pass: skipped", p)
		}
	}
	require.NoError(t, s.e.ResolveTxns(ctx), "every unresponsive primary backs off")
	require.Equal(t, map[string]int{real: 1}, peer.callsSince())

	// Past the first backoff, a pass retries txnProbesMax of them; a second failure doubles it.
	clock.Advance(txnBackoffMin)
	require.ErrorContains(t, s.e.ResolveTxns(ctx), "unreachable")
	retried := peer.callsSince()
	require.Len(t, retried, 1+txnProbesMax(slots))
	require.True(t, s.e.TxnStatus(txnID(1)).Prepared, "undecided at its primary")
	s.e.mu.Lock()
	for p, b := range s.e.txnBackoff {
		if retried[p] > 0 {
			require.Equal(t, 2, b.fails, p)
			require.Equal(t, clock.Now().Add(2*txnBackoffMin), b.until, p)
		}
	}
	require.Len(t, s.e.txnBackoff, hangs, "one entry per unresponsive primary")
	s.e.mu.Unlock()
	require.Equal(t, 32*time.Second, txnBackoffFor(100), "bounded")
}

// TestTxnResolvePassBudget: no run starts later than one TxnCallTimeout into a pass, so fresh
// unresponsive primaries (each call timing out) cost a pass about one TxnCallTimeout per
// slot, not one per TxnResolvePrimariesMax of them: with one slot, a pass calls one of five
// and leaves the rest to the next passes (the failed one backing off). Fails on b3f6c9d: the
// pass calls all five, one after another.
func TestTxnResolvePassBudget(t *testing.T) {
	const primaries = 5
	clock := &fakeClock{}
	peer := newStuckPeer(primaries + 1) // never full: the calls time out
	s := newTxnStore(t, Options{TxnPeer: peer, TxnResolveAfter: time.Second, TxnCallTimeout: 20 * time.Millisecond,
		TxnResolvePrimariesMax: 1, Now: clock.Now})
	for i := range primaries {
		s.requirePrepared(t, txnID(byte(1+i)), 5, fmt.Sprintf("10.0.0.%d:7", i+1), 1, uint64(1+i), 5)
	}
	clock.Advance(time.Second)
	for pass := 1; pass <= 2; pass++ {
		require.ErrorIs(t, s.e.ResolveTxns(context.Background()), context.DeadlineExceeded)
		peer.mu.Lock()
		require.Len(t, peer.calls, pass, "pass %d: one primary called a pass, each once", pass)
		peer.mu.Unlock()
	}
}
