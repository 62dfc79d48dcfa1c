package server

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/sgio"
)

// Hostile review of the peer directory's wait for its next read (4899b71): a client naming
// made-up primaries must not load etcd, tie the check's lock, or outlast its context.

// manualClock is a clock whose timers fire only when the test advances it; armed tells the
// test each timer set (so it knows a check is waiting, without a sleep).
type manualClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []manualTimer
	armed  chan time.Duration
}

type manualTimer struct {
	at time.Time
	ch chan time.Time
}

func newManualClock() *manualClock {
	return &manualClock{now: time.Unix(1_700_000_000, 0), armed: make(chan time.Duration, 1024)}
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	ch := make(chan time.Time, 1)
	c.timers = append(c.timers, manualTimer{c.now.Add(d), ch})
	c.mu.Unlock()
	c.armed <- d
	return ch
}

// Advance moves the clock by d and fires the timers due.
func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	rest := c.timers[:0]
	for _, tm := range c.timers {
		if !tm.at.After(c.now) {
			tm.ch <- c.now
			continue
		}
		rest = append(rest, tm)
	}
	c.timers = rest
}

// awaitArmed waits until n timers were set (or the test's context ends).
func (c *manualClock) awaitArmed(t *testing.T, ctx context.Context, n int) {
	t.Helper()
	for range n {
		select {
		case d := <-c.armed:
			require.LessOrEqual(t, d, peerDirectoryMissEvery, "a wait longer than the window")
		case <-ctx.Done():
			require.FailNow(t, "the checks did not wait", "%v", ctx.Err())
		}
	}
}

// GUARD (holds). A burst of checks naming made-up primaries within one window: each waits
// (no read of its own), all of them together make ONE read of the Directory when the window
// ends, and every one is refused: etcd's load stays one read per peerDirectoryMissEvery
// however many prepares name made-up primaries.
func TestHostilePeerDirectoryMissBurstReadsOncePerWindow(t *testing.T) {
	clock := newManualClock()
	dir := &countingDirectory{nodes: []string{"a:1"}}
	d := newPeerDirectory(&PeerConfig{Directory: dir, Now: clock.Now, After: clock.After})
	ctx := srvCtx(t)
	require.NoError(t, d.check(ctx, "a:1"))

	const burst = 64
	errs := make(chan error, burst)
	for i := range burst {
		go func() { errs <- d.check(ctx, fmt.Sprintf("made-up-%d:1", i)) }()
	}
	clock.awaitArmed(t, ctx, burst)
	require.Equal(t, 1, dir.reads, "no read while they wait")
	clock.Advance(peerDirectoryMissEvery)
	for range burst {
		select {
		case err := <-errs:
			require.ErrorIs(t, err, ErrUnknownPrimary)
		case <-ctx.Done():
			require.FailNow(t, "a check did not return")
		}
	}
	require.Equal(t, 2, dir.reads, "one read for the whole burst")
}

// GUARD (holds). A check waiting for the next read holds no lock: a check of a known
// address returns meanwhile, and the waiting one ends with its context (not the window).
func TestHostilePeerDirectoryWaitHoldsNoLockAndEndsWithContext(t *testing.T) {
	clock := newManualClock()
	dir := &countingDirectory{nodes: []string{"a:1"}}
	d := newPeerDirectory(&PeerConfig{Directory: dir, Now: clock.Now, After: clock.After})
	ctx := srvCtx(t)
	require.NoError(t, d.check(ctx, "a:1"))

	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.check(wctx, "made-up:1") }()
	clock.awaitArmed(t, ctx, 1)
	require.NoError(t, d.check(ctx, "a:1"), "a known primary while another check waits")
	cancel()
	select {
	case err := <-done:
		require.ErrorIs(t, err, ErrUnknownPrimary)
	case <-ctx.Done():
		require.FailNow(t, "the wait outlasted its context")
	}
	require.Equal(t, 1, dir.reads, "a wait ended by its context reads nothing")
}

// GUARD (holds). A made-up primary waits at most once: refused after the next read, not
// again and again (a client cannot keep a prepare parked by re-arming the window).
func TestHostilePeerDirectoryMissWaitsOnce(t *testing.T) {
	clock := newManualClock()
	dir := &countingDirectory{nodes: []string{"a:1"}}
	d := newPeerDirectory(&PeerConfig{Directory: dir, Now: clock.Now, After: clock.After})
	ctx := srvCtx(t)
	require.NoError(t, d.check(ctx, "a:1"))

	first := make(chan error, 1)
	go func() { first <- d.check(ctx, "made-up:1") }()
	clock.awaitArmed(t, ctx, 1)
	clock.Advance(peerDirectoryMissEvery)
	select {
	case err := <-first:
		require.ErrorIs(t, err, ErrUnknownPrimary)
	case <-ctx.Done():
		require.FailNow(t, "the check waited more than once")
	}
	require.Empty(t, clock.armed, "no second wait armed")
	require.Equal(t, 2, dir.reads)
}

// GUARD (holds). Over the wire, as a client (the coordinator's credential): prepares naming
// made-up primaries, many at once on one connection, wait for the Directory's next read off
// the event loop: a commit on the same connection goes through while they wait, then every
// one is refused with ErrUnknownPrimary, nothing of them is prepared, and the Directory was
// read once for them all.
func TestHostileMadeUpPrimariesOverTheWireRefusedAfterOneRead(t *testing.T) {
	clock := newManualClock()
	leases := &txnLeases{}
	dir := &countingDirectory{}
	peer := NewTxnPeer(PeerConfig{Secret: srvPeerSecret, Name: "resolver", DialTimeout: srvTestTimeout, Directory: dir, Now: clock.Now, After: clock.After})
	t.Cleanup(func() { peer.Close() })
	env := startServer(t, func(cfg *Config) {
		cfg.Options.LeaseChecker = leases
		cfg.Options.TxnPeer = peer
		cfg.Options.TxnResolveInterval = -1
	})
	dir.set(false, env.addr)
	n := &txnNode{env: env, peer: peer, coord: env.dial(testOwner)}
	ti, g := srvTable(t, n.coord, "bank", testOwner)
	n.table, n.epoch = ti.Table, g.Epoch
	ctx := srvCtx(t)
	require.NoError(t, peer.CheckPrimary(ctx, env.addr)) // the list read: the window starts

	const burst = 32
	errs := make(chan error, burst)
	for i := range burst {
		m := srvCommit(n.table, testOwner, n.epoch, n.seq+1, []uint64{uint64(i)}, 5)
		go func() {
			_, err := n.coord.PrepareTxn(ctx, &sgio.TxnPrepare{Txn: [16]byte{byte(i + 1)}, Lease: 41, Index: 1, Primary: fmt.Sprintf("made-up-%d.invalid:7000", i), Commit: *m}) // no listener's (127.0.0.1:40000+i was once the server's own port)
			errs <- err
		}()
	}
	clock.awaitArmed(t, ctx, burst)
	require.NoError(t, n.coord.CallInto(ctx, n.commit(99, 7), &sgio.CommitAck{}), "the connection serves while prepares wait")
	clock.Advance(peerDirectoryMissEvery)
	for range burst {
		select {
		case err := <-errs:
			require.ErrorIs(t, err, sgio.ErrMalformed, "ErrUnknownPrimary over the wire")
		case <-ctx.Done():
			require.FailNow(t, "a prepare did not return")
		}
	}
	for i := range burst {
		require.False(t, env.srv.eng.TxnStatus([16]byte{byte(i + 1)}).Prepared, "prepare %d kept", i)
	}
	require.Equal(t, 2, dir.readsNow(), "one read at the start, one for the burst")
}

// readsNow is d.reads under its lock (read by the server's goroutines).
func (d *countingDirectory) readsNow() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.reads
}
