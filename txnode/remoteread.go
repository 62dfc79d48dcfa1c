package txnode

import (
	"context"
	"sync"
	"time"

	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/txnode/store"
)

// A remote read allocates nothing once warm: its request, reply callback and wait channel
// live in a pooled remoteRead, and the RequestTimeout bound of a call whose context has no
// deadline is a pooled timerCtx instead of context.WithTimeout (a context, a timer and a
// channel per call).

// remoteRead is one Read in flight: its ReadPages request and the callback the connection's
// receiver goroutine runs with the reply. A read abandoned by its caller (context done) is
// never reused: its callback may still run.
type remoteRead struct {
	msg   sgio.ReadPages
	n     int
	fill  func(int, uint64, uint64, []byte)
	reply func(sgio.Frame, error) // r.onReply, made once
	done  chan error              // capacity 1: the outcome, sent once per Send

	mu        sync.Mutex // orders the callback against the caller giving up
	abandoned bool
}

var remoteReadPool = sync.Pool{New: func() any {
	r := &remoteRead{done: make(chan error, 1)}
	r.reply = r.onReply
	return r
}}

func getRemoteRead(reqs []store.ReadRequest, fill func(int, uint64, uint64, []byte)) *remoteRead {
	r := remoteReadPool.Get().(*remoteRead)
	r.msg.Wants = r.msg.Wants[:0]
	for _, q := range reqs {
		r.msg.Wants = append(r.msg.Wants, sgio.PageWant{Table: q.Table, Page: q.Page, Want: q.Want})
	}
	r.n, r.fill, r.abandoned = len(reqs), fill, false
	return r
}

// put returns r to the pool unless its caller abandoned it.
func (r *remoteRead) put() {
	if r.abandoned {
		return
	}
	r.fill = nil
	remoteReadPool.Put(r)
}

// onReply fills from the reply in place, on the receiver goroutine, unless the caller gave up
// (it may have released the frames fill writes).
func (r *remoteRead) onReply(f sgio.Frame, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.abandoned {
		return
	}
	if err == nil {
		err = fillFromSegments(f.Body, r.n, r.fill)
	}
	r.done <- err
}

// wait waits for the outcome of one Send, or for ctx; when ctx ends first the read is
// abandoned and ctx's error returned.
func (r *remoteRead) wait(ctx context.Context) error {
	select {
	case err := <-r.done:
		return err
	case <-ctx.Done():
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case err := <-r.done: // it finished just now
		return err
	default:
		r.abandoned = true
		return ctx.Err()
	}
}

// boundCtx returns ctx bounded by d if it has no deadline, and the function that releases
// what that took. A context that can never be cancelled (Background, TODO, WithoutCancel) is
// bounded by a pooled timerCtx; a cancellable one without a deadline by context.WithTimeout.
func boundCtx(ctx context.Context, d time.Duration) (context.Context, func()) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	if ctx.Done() != nil {
		return context.WithTimeout(ctx, d)
	}
	c := timerCtxPool.Get().(*timerCtx)
	c.start(ctx, d)
	return c, c.releaseFn
}

// timerCtx is a reusable context that ends DeadlineExceeded at its deadline, over a parent
// that never ends (so it needs no goroutine to watch one). Reused only when its timer was
// stopped before firing: a fired one is dropped, with its closed channel.
type timerCtx struct {
	context.Context // the parent, for Value
	deadline        time.Time
	timer           *time.Timer
	releaseFn       func() // c.release, made once

	mu   sync.Mutex
	done chan struct{}
	err  error
}

var timerCtxPool sync.Pool // of *timerCtx; New is set in init (release refers to the pool)

func init() { timerCtxPool.New = func() any { return newTimerCtx() } }

func newTimerCtx() *timerCtx {
	c := &timerCtx{done: make(chan struct{})}
	c.timer = time.AfterFunc(time.Hour, c.expire)
	c.timer.Stop()
	c.releaseFn = c.release
	return c
}

func (c *timerCtx) start(parent context.Context, d time.Duration) {
	c.Context, c.deadline = parent, time.Now().Add(d)
	c.timer.Reset(d)
}

func (c *timerCtx) expire() {
	c.mu.Lock()
	if c.err == nil {
		c.err = context.DeadlineExceeded
		close(c.done)
	}
	c.mu.Unlock()
}

// release stops the timer and returns c to the pool if it never fired.
func (c *timerCtx) release() {
	if !c.timer.Stop() {
		return // fired, or firing: c.done is (being) closed, so c is done with
	}
	c.Context = nil
	timerCtxPool.Put(c)
}

// Deadline reports the bound.
func (c *timerCtx) Deadline() (time.Time, bool) { return c.deadline, true }

// Done is closed at the deadline.
func (c *timerCtx) Done() <-chan struct{} { return c.done }

// Err is context.DeadlineExceeded once the deadline has passed, else nil.
func (c *timerCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}
