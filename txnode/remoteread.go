package txnode

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/sgio"
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
	done  chan error              // capacity 1: the outcome, sent once per Send or batch
	// alone makes the read go in a frame of its own: set when a merged frame failed as a
	// whole (an Error reply may concern one member only), so each learns its own outcome.
	alone bool

	mu        sync.Mutex // orders the callback against the caller giving up
	abandoned bool
}

var remoteReadPool = sync.Pool{New: func() any {
	r := &remoteRead{done: make(chan error, 1)}
	r.reply = r.onReply
	return r
}}

func getRemoteRead(reqs []base.PageWant, fill func(int, uint64, uint64, []byte)) *remoteRead {
	r := remoteReadPool.Get().(*remoteRead)
	r.msg.Wants = append(r.msg.Wants[:0], reqs...) // the caller may reuse reqs once it returns
	r.n, r.fill, r.abandoned, r.alone = len(reqs), fill, false, false
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

// deliver hands the outcome of a batch to r, unless its caller gave up; on the receiver
// goroutine, or on a leader whose batch could not be queued.
func (r *remoteRead) deliver(err error) {
	r.mu.Lock()
	if !r.abandoned {
		r.done <- err
	}
	r.mu.Unlock()
}

// wait waits for the outcome of one Send, or for ctx; when ctx ends first the read is
// abandoned and ctx's error returned.
func (r *remoteRead) wait(ctx context.Context) error {
	a, b := waitChans(ctx)
	select {
	case err := <-r.done:
		return err
	case <-a:
	case <-b:
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
// what that took: a pooled timerCtx, where context.WithTimeout took a context, a timer, a
// closure, a channel and, over a cancellable parent, a child registration under the parent's
// lock (27% of the transaction node's CPU on the remote miss path).
func boundCtx(ctx context.Context, d time.Duration) (context.Context, func()) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	c := timerCtxPool.Get().(*timerCtx)
	c.start(ctx, d)
	return c, c.releaseFn
}

// timerCtx is a reusable context that ends DeadlineExceeded at its deadline, or with its
// parent's error once a cancellable parent ended. It watches such a parent lazily: Err
// looks at the parent, and Done registers a watch on it (context.AfterFunc) the first time
// it is called, so a caller about to block on Done sees the parent end at once; waitChans
// gives remoteRead.wait both channels without the watch, so a read that never blocks
// anywhere else registers nothing with the parent. Reused only when it did not end: one that
// did (its timer fired, its parent's watch fired, or Err saw the parent ended) is dropped,
// with its closed channel. It is an afterFuncer (AfterFunc method), so context.AfterFunc and
// contexts derived from it keep their registrations in c, never a goroutine that could call
// c after release. Unlike context.WithTimeout's, context.Cause of an expired timerCtx over a
// cancellable parent is the parent's (nil while it lives): nothing here asks for it.
type timerCtx struct {
	context.Context // the parent, for Value
	deadline        time.Time
	timer           *time.Timer
	releaseFn       func() // c.release, made once
	parentDoneFn    func() // c.parentDone, made once

	mu         sync.Mutex
	watch      bool        // the parent can end
	stopParent func() bool // context.AfterFunc's, once Done registered the watch; else nil
	done       chan struct{}
	err        error
	// afters are the functions registered through the AfterFunc method (context.AfterFunc,
	// WithCancel and the like over c) and not stopped yet; afterSeq numbers them, never
	// reset, so a stale stop finds nothing.
	afters   []afterFn
	afterSeq uint64
}

// afterFn is one function registered with a timerCtx's AfterFunc.
type afterFn struct {
	id uint64
	f  func()
}

var timerCtxPool sync.Pool // of *timerCtx; New is set in init (release refers to the pool)

func init() { timerCtxPool.New = func() any { return newTimerCtx() } }

func newTimerCtx() *timerCtx {
	c := &timerCtx{done: make(chan struct{})}
	c.timer = time.AfterFunc(time.Hour, c.expire)
	c.timer.Stop()
	c.releaseFn = c.release
	c.parentDoneFn = c.parentDone
	return c
}

// start arms c over parent for d. The caller's goroutine, as is release.
func (c *timerCtx) start(parent context.Context, d time.Duration) {
	c.Context, c.deadline = parent, time.Now().Add(d)
	c.mu.Lock()
	c.watch, c.stopParent = parent.Done() != nil, nil
	c.mu.Unlock()
	c.timer.Reset(d)
}

// endLocked closes c with err, once, and starts the functions registered with AfterFunc,
// each on its own goroutine (the caller may hold locks they take). Caller holds mu.
func (c *timerCtx) endLocked(err error) {
	if c.err != nil {
		return
	}
	c.err = err
	close(c.done)
	for i, a := range c.afters {
		go a.f()
		c.afters[i] = afterFn{}
	}
	c.afters = c.afters[:0]
}

func (c *timerCtx) expire() {
	c.mu.Lock()
	c.endLocked(context.DeadlineExceeded)
	c.mu.Unlock()
}

// parentDone runs (on its own goroutine) when the watched parent ends before release.
func (c *timerCtx) parentDone() {
	c.mu.Lock()
	c.endLocked(c.Context.Err())
	c.mu.Unlock()
}

// release stops the timer and the parent's watch and returns c to the pool if c did not end.
// A function still registered with AfterFunc (a context derived from c that its caller did
// not cancel) is run, c ending Canceled, as context.WithTimeout's cancel would: c is then not
// reused, since that context still refers to it.
func (c *timerCtx) release() {
	reuse := c.timer.Stop() // false: fired, or firing: c.done is (being) closed
	c.mu.Lock()
	if c.stopParent != nil && !c.stopParent() {
		reuse = false // the parent ended: parentDone runs or ran
	}
	c.stopParent = nil
	if len(c.afters) > 0 {
		c.endLocked(context.Canceled)
	}
	reuse = reuse && c.err == nil
	c.mu.Unlock()
	if !reuse {
		return
	}
	c.Context = nil
	timerCtxPool.Put(c)
}

// AfterFunc makes c an afterFuncer: context.AfterFunc(c, f), and a context derived from c
// (context.WithCancel(c), say), register f here instead of starting a goroutine that waits on
// c.Done. Such a goroutine could outlive release and call Done and Err on c once it is back
// in the pool or another read's (the remote store's reconnect waits register their wake-up
// on a read's bound: TestBoundCtxAfterFuncNoLateUse). f runs on its own goroutine once c
// ends, or at release; stop reports whether it stopped f from running. Any goroutine.
func (c *timerCtx) AfterFunc(f func()) (stop func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		go f()
		return func() bool { return false }
	}
	c.watchLocked()
	c.afterSeq++
	id := c.afterSeq
	c.afters = append(c.afters, afterFn{id: id, f: f})
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for i, a := range c.afters {
			if a.id == id {
				n := len(c.afters) - 1
				copy(c.afters[i:], c.afters[i+1:])
				c.afters[n] = afterFn{}
				c.afters = c.afters[:n]
				return true
			}
		}
		return false
	}
}

// watchLocked registers the watch on a cancellable parent, once, while c has not ended.
// Caller holds mu.
func (c *timerCtx) watchLocked() {
	if c.watch && c.stopParent == nil && c.err == nil {
		c.stopParent = context.AfterFunc(c.Context, c.parentDoneFn)
	}
}

// waitChans returns the channels a wait on ctx selects on: ctx.Done(), or for a timerCtx its
// own channel and its parent's (nil for a parent that never ends), without registering a
// watch on the parent.
func waitChans(ctx context.Context) (a, b <-chan struct{}) {
	if c, ok := ctx.(*timerCtx); ok {
		return c.done, c.Context.Done()
	}
	return ctx.Done(), nil
}

// Deadline reports the bound.
func (c *timerCtx) Deadline() (time.Time, bool) { return c.deadline, true }

// Done is closed at the deadline or once the parent ended. Over a cancellable parent, the
// first call registers the watch on it.
func (c *timerCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.watchLocked()
	return c.done
}

// Err is context.DeadlineExceeded once the deadline has passed, the parent's error once the
// parent ended (c then ends too, so Done is closed whenever Err is not nil), else nil.
func (c *timerCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil && c.watch {
		if err := c.Context.Err(); err != nil {
			c.endLocked(err)
		}
	}
	return c.err
}

// Merged reads. Goroutines that miss at the same time share one ReadPages frame: a read joins
// the connection's open batch (the one queued and not yet taken by the client's sender),
// or opens one and sends it. The sender seals a batch when it takes it (sgio.Sealer), so a
// batch carries every read that arrived while the previous write ran: one frame, one reply,
// one server-side dispatch (and one Engine.ReadCached) for all of them, instead of one each.
// The reply is checked whole (count, table and page of every segment) before anything is
// filled; then each member's segments are filled and that member woken, in order.
//
// A batch is bounded before a read joins it: a request body the server accepts (its
// MaxBody: a batch the server refused would break the connection, and every member would
// retry into another such batch), and at most readMergeWantsMax page wants (so the
// request and its largest reply fit every body limit, and the server's reused request
// buffers keep them: readWantsKeep there). A batch answered with an Error (one member's
// table dropped, say) is retried by each of its members alone, so that each gets its own
// outcome; a broken connection fails every member retryably, as a single read, and a reply
// that does not answer the wants fails every member with ErrMalformed.

// readMergeWantsMax bounds the page wants of one merged ReadPages: 64 wants of whole pages of
// the largest rows are a 16 MiB reply, within sgio.MaxBodyLimit; 64 single-row wants are 1.5
// KiB of request.
const readMergeWantsMax = 64

// errReadAgain tells a member of a batch to read again alone (the batch failed as a whole,
// or was never queued).
var errReadAgain = errors.New("txnode: merged read to be sent again alone")

// readBatch is one merged ReadPages in flight: the wants of its members, in joining order,
// and the members. It is an sgio.Sealer: open until the client's sender takes it.
type readBatch struct {
	conn    *sgio.Client
	bodyMax int                     // conn's MaxRequestBody: the request may not grow beyond it
	reply   func(sgio.Frame, error) // b.onReply, made once

	mu      sync.Mutex // orders joins against Seal and the reply
	sealed  bool
	msg     sgio.ReadPages
	members []*remoteRead
}

var readBatchPool sync.Pool // of *readBatch; New is set in init (recycle refers to the pool)

func init() {
	readBatchPool.New = func() any {
		b := &readBatch{}
		b.reply = b.onReply
		return b
	}
}

// getReadBatch returns an empty open batch for conn. Caller holds the store's rmu.
func getReadBatch(conn *sgio.Client) *readBatch {
	b := readBatchPool.Get().(*readBatch)
	b.mu.Lock()
	b.conn, b.bodyMax, b.sealed = conn, sgio.MaxBodyLimit, false
	if conn != nil { // nil: a batch under test, never sent
		b.bodyMax = conn.MaxRequestBody()
	}
	b.mu.Unlock()
	return b
}

// join adds r's wants to b if b is open on conn and has room (at most readMergeWantsMax
// wants, and a request body the server accepts); it reports whether it did.
func (b *readBatch) join(conn *sgio.Client, r *remoteRead) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sealed || b.conn != conn || len(b.msg.Wants)+len(r.msg.Wants) > readMergeWantsMax ||
		b.msg.BodySize()+r.msg.BodySize()-8 > b.bodyMax { // one count word: b's
		return false
	}
	b.msg.Wants = append(b.msg.Wants, r.msg.Wants...)
	b.members = append(b.members, r)
	return true
}

// seal closes b to joins and returns its members. Any goroutine.
func (b *readBatch) seal() []*remoteRead {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sealed = true
	return b.members
}

// Seal is sgio.Sealer's: the client's sender takes b.
func (b *readBatch) Seal() { b.seal() }

// Type reports TypeReadPages.
func (b *readBatch) Type() sgio.Type { return sgio.TypeReadPages }

// BodySize reports the encoded body length of the wants joined so far.
func (b *readBatch) BodySize() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.msg.BodySize()
}

// AppendBody encodes the wants (the sender calls it once b is sealed).
func (b *readBatch) AppendBody(dst []byte) []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.msg.AppendBody(dst)
}

// Validate checks the wants joined so far (each member's were checked as it joined).
func (b *readBatch) Validate() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.msg.Validate()
}

// Parse is not supported: a batch is only sent.
func (b *readBatch) Parse([]byte) error {
	return fmt.Errorf("txnode: a merged read is not parsed: %w", sgio.ErrUnsupported)
}

// recycle returns b to the pool once nothing refers to its members any more: after its
// reply, or once it failed to be queued. A batch left as the store's open one is sealed, so
// no read joins it; getReadBatch reopens it under the store's rmu.
func (b *readBatch) recycle() {
	b.mu.Lock()
	clear(b.members)
	b.members = b.members[:0]
	b.msg.Wants = b.msg.Wants[:0]
	b.conn = nil
	b.mu.Unlock()
	readBatchPool.Put(b)
}

// onReply checks the reply whole, then fills and wakes each member in turn, on the
// connection's receiver goroutine (it never blocks: a member's lock is held only by its
// caller giving up).
func (b *readBatch) onReply(f sgio.Frame, err error) {
	members := b.seal()
	again := err != nil && !retryable(err) && len(members) > 1 // an Error reply, maybe one member's
	if err == nil {
		err = checkSegments(f.Body, b.msg.Wants) // a reply that breaks the protocol is everyone's
	}
	switch {
	case again:
		for _, r := range members {
			r.mu.Lock()
			if !r.abandoned {
				r.alone = true // read by r's caller once it took the outcome
				r.done <- errReadAgain
			}
			r.mu.Unlock()
		}
	case err != nil:
		for _, r := range members {
			r.deliver(err)
		}
	default:
		it, _ := sgio.ViewSegments(f.Body) // checked above
		var seg base.Segment
		for _, r := range members {
			r.mu.Lock()
			for i := range r.n {
				it.Next(&seg)
				if !r.abandoned {
					r.fill(i, seg.Data, seg.Clear, seg.Rows)
				}
			}
			if !r.abandoned {
				r.done <- nil
			}
			r.mu.Unlock()
		}
	}
	b.recycle()
}

// checkSegments checks that body answers wants: one segment per want, in order, each of the
// wanted table and page.
func checkSegments(body []byte, wants []base.PageWant) error {
	it, err := sgio.ViewSegments(body)
	if err != nil {
		return err
	}
	if it.Len() != len(wants) {
		return fmt.Errorf("txnode: %d segments answer %d page requests: %w", it.Len(), len(wants), sgio.ErrMalformed)
	}
	var seg base.Segment
	for i := 0; it.Next(&seg); i++ {
		if w := wants[i]; seg.Table != w.Table || seg.Page != w.Page {
			return fmt.Errorf("txnode: segment %d is table %d page %d, the request's table %d page %d: %w",
				i, seg.Table, seg.Page, w.Table, w.Page, sgio.ErrMalformed)
		}
	}
	return nil
}
