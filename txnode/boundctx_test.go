package txnode

import (
	"context"
	"encoding/binary"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestBoundCtxCancellableParent: the pooled bound of a context without a deadline also ends
// when a cancellable parent ends (with the parent's error), ends DeadlineExceeded at its
// deadline while the parent lives, and one that ended either way never goes back to the pool
// (a later bound starts live).
func TestBoundCtxCancellableParent(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	ctx, release := boundCtx(parent, time.Hour)
	dl, ok := ctx.Deadline()
	require.True(t, ok)
	require.WithinDuration(t, time.Now().Add(time.Hour), dl, time.Minute)
	require.NoError(t, ctx.Err())
	cancel()
	select {
	case <-ctx.Done():
	case <-time.After(30 * time.Second):
		require.FailNow(t, "the bound did not end with its parent")
	}
	require.ErrorIs(t, ctx.Err(), context.Canceled)
	release()
	for range 100 { // a fired bound is never handed out again
		p, c := context.WithCancel(context.Background())
		b, rel := boundCtx(p, time.Hour)
		require.NoError(t, b.Err())
		select {
		case <-b.Done():
			require.FailNow(t, "a bound that ended was reused")
		default:
		}
		rel()
		c()
	}

	// Done taken before the parent ends (the watch fires), and Err alone (no watch).
	parent, cancel = context.WithCancel(context.Background())
	ctx, release = boundCtx(parent, time.Hour)
	done := ctx.Done()
	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		require.FailNow(t, "the watch did not end the bound")
	}
	require.ErrorIs(t, ctx.Err(), context.Canceled)
	release()
	parent, cancel = context.WithCancel(context.Background())
	ctx, release = boundCtx(parent, time.Hour)
	cancel()
	require.ErrorIs(t, ctx.Err(), context.Canceled)
	select {
	case <-ctx.Done(): // closed whenever Err is not nil
	default:
		require.FailNow(t, "Err reported the parent's end but Done is open")
	}
	release()

	parent, cancel = context.WithCancel(context.Background())
	defer cancel()
	ctx, release = boundCtx(parent, time.Millisecond)
	select {
	case <-ctx.Done():
	case <-time.After(30 * time.Second):
		require.FailNow(t, "the bound did not end at its deadline")
	}
	require.ErrorIs(t, ctx.Err(), context.DeadlineExceeded)
	require.NoError(t, parent.Err())
	release()
	b, rel := boundCtx(parent, time.Hour)
	require.NoError(t, b.Err())
	rel()
}

// TestRemoteMissCancelledParent: a cache miss whose context is cancellable and has no deadline
// ends with context.Canceled once its caller cancels while the reply is held back, and later
// misses (under fresh bounds) succeed.
func TestRemoteMissCancelledParent(t *testing.T) {
	ctx := context.Background()
	proxy, db, tb, ids := coldPageZero(t, ctx, "cancelled", Options{})
	defer db.Close(ctx)
	buf := make([]byte, 64)
	select {
	case <-proxy.held: // a stale token
	default:
	}
	proxy.setPaused(true)
	cctx, cancel := context.WithCancel(ctx)
	res := make(chan error, 1)
	go func() { res <- tb.Get(cctx, ids[0], buf) }()
	select {
	case <-proxy.held: // the read's reply is held back: the read waits for it
	case <-time.After(30 * time.Second):
		require.FailNow(t, "the read's reply never came")
	}
	cancel()
	select {
	case err := <-res:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(30 * time.Second):
		require.FailNow(t, "the miss did not end with its context")
	}
	proxy.setPaused(false)
	for i := 0; i < 200; i++ {
		c, cancel := context.WithCancel(ctx)
		id := ids[(i*977)%len(ids)]
		require.NoError(t, tb.Get(c, id, buf), "miss %d after the cancelled one", i)
		require.Equal(t, uint64((i*977)%len(ids)), binary.LittleEndian.Uint64(buf))
		cancel()
	}
}

// TestBoundCtxAfterFuncNoLateUse: context.AfterFunc over a pooled bound (what the remote
// store's reconnect waits, client and awaitNewConn, do with a read's bound) leaves nothing
// that touches the bound once it was stopped and the bound released. Over a context without
// an AfterFunc method the context package starts a goroutine per registration that calls the
// bound's Done later, maybe after release, when the bound is back in the pool (its parent
// gone: a nil dereference) or another read's (a data race, a watch on the wrong parent).
// Fails on 643f402: a goroutine per registration, and a panic in one of them.
func TestBoundCtxAfterFuncNoLateUse(t *testing.T) {
	n := 2000
	if testing.Short() {
		n = 500
	}
	// The sequence of awaitNewConn when the new connection is already up: register, stop,
	// release, and the next read takes the bound from the pool.
	for range n {
		p, cancel := context.WithCancel(context.Background())
		b, rel := boundCtx(p, time.Hour)
		stop := context.AfterFunc(b, func() { panic("stopped AfterFunc ran") })
		require.True(t, stop())
		rel()
		cancel()
	}

	// Registrations are held by the bound itself: no goroutine per registration.
	const k = 100
	before := runtime.NumGoroutine()
	stops := make([]func() bool, 0, k)
	rels := make([]func(), 0, k)
	parents := make([]context.CancelFunc, 0, k)
	for range k {
		p, cancel := context.WithCancel(context.Background())
		b, rel := boundCtx(p, time.Hour)
		stops = append(stops, context.AfterFunc(b, func() {}))
		rels, parents = append(rels, rel), append(parents, cancel)
	}
	grew := runtime.NumGoroutine() - before
	for i := range k {
		require.True(t, stops[i]())
		rels[i]()
		parents[i]()
	}
	require.Less(t, grew, k/2, "goroutines started by %d AfterFunc registrations on bounds", k)

	// The registered function runs when the bound ends: its parent ends, or its deadline.
	ran := make(chan struct{}, 1)
	p, cancel := context.WithCancel(context.Background())
	b, rel := boundCtx(p, time.Hour)
	stop := context.AfterFunc(b, func() { ran <- struct{}{} })
	cancel()
	recvWithin(t, ran, "the AfterFunc after the parent ended")
	require.False(t, stop())
	require.ErrorIs(t, b.Err(), context.Canceled)
	rel()

	p, cancel = context.WithCancel(context.Background())
	defer cancel()
	b, rel = boundCtx(p, time.Millisecond)
	stop = context.AfterFunc(b, func() { ran <- struct{}{} })
	recvWithin(t, ran, "the AfterFunc at the deadline")
	require.False(t, stop())
	require.ErrorIs(t, b.Err(), context.DeadlineExceeded)
	rel()

	// A context derived from the bound ends with it, and at release at the latest (as the
	// cancel of context.WithTimeout would end it); the bound is then not reused.
	p, cancel = context.WithCancel(context.Background())
	defer cancel()
	b, rel = boundCtx(p, time.Hour)
	child, childCancel := context.WithCancel(b)
	defer childCancel()
	require.NoError(t, child.Err())
	rel()
	select {
	case <-child.Done():
	case <-time.After(30 * time.Second):
		require.FailNow(t, "a context derived from a released bound never ended")
	}
	for range 100 {
		nb, nrel := boundCtx(p, time.Hour)
		require.NoError(t, nb.Err(), "a bound released with a live derived context was reused")
		nrel()
	}
}
