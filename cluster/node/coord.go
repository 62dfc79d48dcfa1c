package node

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/weftdb/weft/cluster/internal/testhook"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/txnode"
	"github.com/weftdb/weft/txnode/txncoord"
)

// The two-phase commit's coordinator (docs/cluster.md, "What the coordinator must do"):
//
//  1. The transaction id is the session's lease id and a counter of this node (unique in the
//     cluster: a lease id is never handed out twice by one etcd cluster); the participants
//     are the parts written, numbered 0..n-1 in the order of their first write; participant 0
//     is the primary. The session is checked before anything is sent.
//  2. Every participant is prepared (in parallel, one goroutine each, n <= 64), under the
//     session's lease id, each batch fenced by its tables' epochs. Any refusal (or a prepare
//     whose answer never came): abort recorded at the primary, abort applied to every part
//     that was or may have been prepared, the transaction failed: ErrConflict (run again)
//     when every refusal was a conflict, else an error matching ErrAborted (definiteAbort:
//     never txnode.ErrUnknownOutcome), a *NotOwnerError when a partition is being moved.
//     An abort the primary did not answer (ctx ended, the primary busy or unreachable) is
//     sent again in the background until recorded or Close (recordAbortLater: bounded
//     goroutines and queue), so that a resolver's Ask is
//     answered at once rather than after the lease ends.
//  3. All prepared: every part's reads validated again, and the read-only parts' too (all
//     writes locked: serializable across storage nodes), the session checked (never decide
//     past the lease's deadline), then Decide(commit) at the primary. Its answer is the
//     outcome; a lost answer is asked again with the SAME decision (never another one); an
//     abort recorded (a resolver's, after the lease was gone) fails the transaction, unless
//     an answer was lost and more than decideTrust passed since the first Decide: then the
//     primary may have forgotten the commit, and the outcome is reported unknown.
//  4. The decision applied to every participant (in parallel), each retried until answered;
//     each part's rows stay locked in this node's cache until its storage node answered,
//     then take the committed values (txncoord.Prepared.Apply). A part whose transaction node
//     died and was closed (heal.go) is abandoned: its storage node's resolver settles it.
//  5. Whatever ctx does after the decision was sent, the transaction is finished in the
//     background (the same Decide resent until answered, then the Applies) until Close; the
//     storage nodes' resolvers finish it anyway (once the lease is gone, or at once when the
//     decision is recorded).

// coordSerialPrepares, when set by a test, prepares the participants one after another, in
// their order, instead of in parallel: a test can then act between two prepares.
var coordSerialPrepares bool

// coordDecideAnswer, when set by a test, sees each Decide's answer (attempt 0, 1, ...)
// and returns the error the coordinator takes instead: a test can lose an answer.
var coordDecideAnswer func(attempt int, err error) error

// coordPrepareAnswer, when set by a test, sees each participant's Prepare answer and returns
// the error the coordinator takes instead: a test can refuse a prepare.
var coordPrepareAnswer func(i int, err error) error

// coordNow is the coordinator's clock (a test's fake one).
var coordNow = time.Now

// decideTrust is how long after its first Decide(commit) the coordinator trusts an answer
// "abort recorded" that came after an answer it lost: a storage node remembers a decision
// it forgot (every participant reported) for its TxnAbortKeep (10 min by default), at most
// its TxnForgetMax (65536) of them, and across a restart its MaxTxns newest; past the keep,
// a resent Decide of a forgotten commit records abort when the lease is gone (while one
// gave way to the bounds, it refuses with ErrTxnBusy instead: retried here). Well inside the
// default keep (a margin for clock rates); a shorter window only turns more aborts into
// ErrUnknownOutcome. A var for tests.
var decideTrust = time.Minute

// decisionUncertain is decide's answer when abort was recorded but the transaction may
// have committed (see decideTrust): it is reported as txnode.ErrUnknownOutcome, and the
// parts are aborted at their storage nodes and dropped from the caches.
const decisionUncertain txncoord.Decision = 0xff

// hook calls testhook.CoordStep, when a test set it (before any transaction), at each step of
// the protocol.
func hook(step string, i int) {
	if h := testhook.CoordStep.Load(); h != nil {
		(*h)(step, i)
	}
}

// coordRetry is the pause before a Decide or Apply is sent again after an answer that was
// neither the outcome nor the end of the context (the storage node busy, etcd unreachable at
// the primary's lease check).
const coordRetry = 20 * time.Millisecond

// txnID returns a transaction id unique in the cluster and not to be guessed: the session's
// lease id, this node's counter (its low 32 bits: unique within a lease for 2^32
// transactions), then 32 bits from crypto/rand, fresh for each transaction, so that an id
// seen in a WAL or a backup says nothing about the next one (issue 22, defect 4).
func (n *Node) txnID() [16]byte {
	var id [16]byte
	binary.BigEndian.PutUint64(id[:8], uint64(n.sess.Lease()))
	binary.BigEndian.PutUint32(id[8:12], uint32(n.txnSeq.Add(1)))
	_, _ = rand.Read(id[12:]) // crypto/rand.Read never fails; it crashes the program instead
	if h := txnIDHook; h != nil {
		h(id)
	}
	return id
}

// txnIDHook, set by tests only, hears each transaction id as it is made.
var txnIDHook func(id [16]byte)

// twoPhase commits tx's parts atomically (steps 1..4 above).
func (n *Node) twoPhase(tx *Tx) error {
	ctx := tx.ctx
	var readers []*txPart
	for _, pt := range tx.parts {
		if !pt.wrote {
			readers = append(readers, pt)
		}
	}
	rollbackReaders := func() {
		for _, pt := range readers {
			pt.tx.Rollback()
		}
	}
	if err := n.sess.Check(); err != nil {
		tx.rollback()
		return fmt.Errorf("node: two-phase commit: the session: %w", err)
	}
	primaryAddr := tx.writers[0].addr
	c := &coordTxn{n: n, id: n.txnID(), lease: n.sess.Lease(), primary: tx.writers[0].db, primaryAddr: primaryAddr, count: len(tx.writers)}
	c.prepared = make([]*txncoord.Prepared, len(tx.writers))
	errs := make([]error, len(tx.writers))
	var wg sync.WaitGroup
	var mu sync.Mutex
	answered := 0
	for i, w := range tx.writers {
		info := txncoord.TxnInfo{ID: c.id, Lease: c.lease, Index: uint16(i)}
		if i > 0 {
			info.Primary = primaryAddr
		}
		prep := func() {
			c.prepared[i], errs[i] = txncoord.Prepare(w.tx, info)
			if h := coordPrepareAnswer; h != nil {
				errs[i] = h(i, errs[i]) // a part prepared stays in c.prepared: the abort applies to it
			}
			mu.Lock()
			answered++
			k := answered
			mu.Unlock()
			hook("prepared", k)
		}
		if coordSerialPrepares {
			prep()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			prep()
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		rollbackReaders()
		c.abort(ctx)
		if allConflicts(errs) {
			return txnode.ErrConflict
		}
		aborted := definiteAbort(c.id, err)
		for i, perr := range errs {
			if errors.Is(perr, txnode.ErrMoved) {
				return tx.movedAtPrepare(tx.writers[i].addr, aborted)
			}
		}
		return aborted
	}
	// Every write is locked: validate every read now.
	for _, p := range c.prepared {
		if err := p.Validate(); err != nil {
			rollbackReaders()
			c.abort(ctx)
			return err
		}
	}
	for i, pt := range readers {
		if err := pt.tx.Commit(); err != nil {
			for _, rest := range readers[i+1:] {
				rest.tx.Rollback()
			}
			c.abort(ctx)
			return err
		}
	}
	// Validated where the partitions are served still (a table replaced since it was
	// touched validated against a cache nothing writes any more).
	if err := tx.stillServed(); err != nil {
		c.abort(ctx)
		return err
	}
	hook("prepared-all", len(c.prepared))
	if err := n.sess.Check(); err != nil {
		c.abort(ctx)
		return fmt.Errorf("node: two-phase commit %x: the session before the decision: %w", c.id, err)
	}
	d, err := c.decide(ctx)
	if err != nil {
		return err
	}
	hook("decided", 0)
	if d == decisionUncertain {
		c.apply(ctx, decisionUncertain)
		return fmt.Errorf("node: two-phase commit %x: %w: the primary answered abort after a commit decision unanswered for %v or more: it may have committed and been forgotten", c.id, txnode.ErrUnknownOutcome, decideTrust)
	}
	if d == txncoord.DecisionAbort {
		c.apply(ctx, txncoord.DecisionAbort)
		return fmt.Errorf("node: two-phase commit %x: the primary recorded abort (the session's lease ended): %w", c.id, txnode.ErrTxnDecided)
	}
	c.apply(ctx, txncoord.DecisionCommit)
	return nil
}

// coordTxn is one two-phase commit in progress.
type coordTxn struct {
	n       *Node
	id      [16]byte
	lease   int64
	primary *txnode.DB
	// primaryAddr is the primary's storage node address.
	primaryAddr string
	count       int
	prepared    []*txncoord.Prepared // nil where not prepared (refused)
	// Of decide (one goroutine at a time: the caller's, then the background's): when the
	// first Decide(commit) was sent (coordNow), whether an answer was lost since, and the
	// attempts made.
	firstDecide time.Time
	lost        bool
	attempts    int
}

// definiteAbort is the error of a two-phase commit that failed at its prepare step (err:
// the prepares' errors, joined). The coordinator never decides commit after a failed prepare
// (it aborts every part), so the transaction aborted, whatever each prepare's own fate: one
// whose answer was lost (txnode.ErrUnknownOutcome) may have landed, and is aborted too. The
// caller must not be told "outcome unknown" (that it may have committed): the error reads
// "aborted", matches ErrAborted and every cause but the unknown outcomes (a refusal such as
// txnode.ErrTxnBusy or ErrMoved, the context's error), never txnode.ErrUnknownOutcome.
func definiteAbort(id [16]byte, err error) error {
	return &abortedError{id: id, err: err, causes: withoutUnknown(err)}
}

// abortedError is a two-phase commit aborted at its prepare step (definiteAbort).
type abortedError struct {
	id     [16]byte
	err    error   // the prepares' errors, for the text
	causes []error // err's chain without the unknown outcomes
}

func (e *abortedError) Error() string {
	return fmt.Sprintf("node: two-phase commit %x aborted, nothing of it applied: prepare: %s", e.id, strings.ReplaceAll(e.err.Error(), "\n", "; "))
}

// Unwrap makes errors.Is(err, ErrAborted) hold, and errors.Is of each cause.
func (e *abortedError) Unwrap() []error { return append([]error{ErrAborted}, e.causes...) }

// withoutUnknown returns the errors of err's tree that are not an unknown outcome (txnode's,
// or the storage node's and the wire's: a request whose answer was lost): err itself when
// it matches none, else the branches of its tree (in order) that match none.
func withoutUnknown(err error) []error {
	if err == nil {
		return nil
	}
	if !errors.Is(err, txnode.ErrUnknownOutcome) && !errors.Is(err, storenode.ErrUnknownOutcome) {
		return []error{err}
	}
	var out []error
	switch u := err.(type) {
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if e != nil {
				out = append(out, withoutUnknown(e)...)
			}
		}
	case interface{ Unwrap() error }:
		if e := u.Unwrap(); e != nil {
			out = withoutUnknown(e)
		}
	}
	return out
}

func allConflicts(errs []error) bool {
	any := false
	for _, err := range errs {
		if err != nil {
			if !errors.Is(err, txnode.ErrConflict) {
				return false
			}
			any = true
		}
	}
	return any
}

// decide sends Decide(commit) to the primary until it answers: DecisionCommit (recorded),
// DecisionAbort (abort was recorded), decisionUncertain (abort was recorded, but an earlier
// answer was lost more than decideTrust after the first Decide: the primary may have
// forgotten the commit), or, when ctx ends first, an error wrapping
// txnode.ErrUnknownOutcome (the transaction is then finished in the background).
func (c *coordTxn) decide(ctx context.Context) (txncoord.Decision, error) {
	if c.firstDecide.IsZero() {
		c.firstDecide = coordNow()
	}
	for {
		err := txncoord.DecideTxn(ctx, c.primary, c.id, c.lease, txncoord.DecisionCommit, c.count)
		if h := coordDecideAnswer; h != nil {
			err = h(c.attempts, err)
		}
		c.attempts++
		switch {
		case err == nil:
			return txncoord.DecisionCommit, nil
		case errors.Is(err, txnode.ErrTxnDecided):
			if c.lost && coordNow().Sub(c.firstDecide) >= decideTrust {
				return decisionUncertain, nil
			}
			return txncoord.DecisionAbort, nil
		}
		c.lost = true
		switch {
		case ctx.Err() != nil || c.n.closedErr() != nil:
			c.n.finishLater(c, txncoord.DecisionNone)
			return 0, fmt.Errorf("node: two-phase commit %x: %w: the decision sent, its answer not received (%w)", c.id, txnode.ErrUnknownOutcome, err)
		}
		if !pause(ctx, coordRetry) {
			continue // the next DecideTxn sees ctx ended
		}
	}
}

// abort records abort at the primary and applies it to every part that was (or may have
// been) prepared; what ctx leaves undone is finished in the background: the record too
// (recordAbortLater), when the primary did not answer (ctx ended, the primary busy or
// unreachable).
func (c *coordTxn) abort(ctx context.Context) {
	// The primary's record makes a resolver's Ask answer at once (a part this node could
	// not reach is settled without waiting for the lease to end). Nothing else is ever
	// decided for the transaction, so sending it again is always safe.
	err := txncoord.DecideTxn(ctx, c.primary, c.id, c.lease, txncoord.DecisionAbort, c.count)
	if err != nil && !errors.Is(err, txnode.ErrTxnDecided) {
		// The primary's own part is aborted after a first try to record the abort: aborted
		// first, the primary holds no part of the transaction and records nothing
		// (decideGuard), and a resolver's Ask waits for the lease to end. With ctx ended the
		// Decide above never reached the primary: the recording goroutine's first try is the
		// first, and it aborts the part after it (recorded or not: a primary refusing the
		// record, busy, must not keep the part's rows locked).
		r := abortRecord{id: c.id, lease: c.lease, count: c.count, primary: c.primary, primaryAddr: c.primaryAddr}
		if ctx.Err() != nil {
			r.part = c.prepared[0]
		}
		if c.n.recordAbortLater(r) && r.part != nil {
			c.prepared[0] = nil
		}
	}
	c.apply(ctx, txncoord.DecisionAbort)
}

// Bounds of the abort records sent again in the background (recordAbortLater): at most
// abortRecordQueue waiting (past it an abort is left to the resolvers, which record it once
// the coordinator's lease is gone: liveness only), recorded by at most abortRecordMax
// goroutines at once, one at a time each, Decides sent until the primary answers or the Node
// closes, each bounded by abortRecordTimeout, coordRetry doubling up to abortRecordPauseMax
// between them. Not a number of tries: the primary's part prepared and the abort not
// recorded, that part stays in doubt (its rows locked, its resolver answered "undecided")
// for as long as the coordinator's lease lives, which on a healthy node is for good.
const (
	abortRecordMax      = 64
	abortRecordQueue    = 4096
	abortRecordTimeout  = 5 * time.Second
	abortRecordPauseMax = time.Second
)

// abortRecord is an abort to record at its primary (recordAbortLater), and the primary's
// prepared part (nil if none) to abort after the first try to record it.
type abortRecord struct {
	id          [16]byte
	lease       int64
	count       int
	primary     *txnode.DB
	primaryAddr string
	part        *txncoord.Prepared
}

// recordAbortLater sends Decide(abort) of r to its primary again in the background, under
// the Node's context (Close abandons it), until the primary answers, aborting r.part after
// the first try: queued (n.aborts) for the recording goroutines, started up to
// abortRecordMax. It reports
// whether r was queued: when not (the Node closed, the queue full), r.part is the caller's
// to abort. Any goroutine; it does not block.
func (n *Node) recordAbortLater(r abortRecord) bool {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return false
	}
	if len(n.aborts) >= abortRecordQueue {
		n.mu.Unlock()
		n.log.Warn("node: two-phase commit: too many aborts being recorded: this one is left to the storage nodes' resolvers (once the lease ends)",
			"txn", fmt.Sprintf("%x", r.id))
		return false
	}
	n.aborts = append(n.aborts, r)
	if n.recording >= abortRecordMax {
		n.mu.Unlock()
		return true // a recording goroutine takes it once it is done with the one it has
	}
	n.recording++
	n.finishing.Add(1)
	n.mu.Unlock()
	go func() {
		defer n.finishing.Done()
		for {
			n.mu.Lock()
			if len(n.aborts) == 0 || n.bg.Err() != nil {
				left := n.aborts
				n.aborts = nil
				n.recording--
				n.mu.Unlock()
				for _, r := range left {
					if r.part != nil {
						r.part.Abandon() // closing: its storage node's resolver finishes it
					}
				}
				return
			}
			r := n.aborts[0]
			n.aborts[0] = abortRecord{}
			n.aborts = n.aborts[1:]
			if len(n.aborts) == 0 {
				n.aborts = nil // the backing array freed
			}
			n.mu.Unlock()
			n.recordAbort(r)
		}
	}()
	return true
}

// recordAbort sends Decide(abort) of r to its primary until the primary answers or the Node
// closes: over r.primary while it lives, else over the storage node's live transaction node,
// replacing the dead one first (Node.db, heal.go: nothing else may use that storage node
// soon). A recording goroutine's (recordAbortLater).
func (n *Node) recordAbort(r abortRecord) {
	ctx := n.bg
	wait := coordRetry
	for try := 0; ; try++ {
		actx, cancel := context.WithTimeout(ctx, abortRecordTimeout)
		db, err := r.primary, r.primary.Err()
		if err != nil {
			db, err = n.db(actx, r.primaryAddr) // the dead one replaced (heal.go)
		}
		if err == nil {
			hook("abort-recording", try)
			err = txncoord.DecideTxn(actx, db, r.id, r.lease, txncoord.DecisionAbort, r.count)
		}
		cancel()
		if r.part != nil {
			// The primary's part aborts after this first try (abort): in the background,
			// while the tries go on (finishLater: abandoned if the Node closes).
			n.finishLater(&coordTxn{n: n, prepared: []*txncoord.Prepared{r.part}}, txncoord.DecisionAbort)
			r.part = nil
		}
		if err == nil || errors.Is(err, txnode.ErrTxnDecided) {
			return
		}
		if ctx.Err() != nil || !pause(ctx, wait) {
			return // closing: the resolvers record it once the lease is gone
		}
		if wait = min(2*wait, abortRecordPauseMax); try == 8 {
			n.log.Warn("node: two-phase commit: the abort is not recorded at the primary yet (tried again until the node closes)",
				"txn", fmt.Sprintf("%x", r.id), "primary", r.primaryAddr, "err", err)
		}
	}
}

// apply applies d to every prepared part, in parallel, each retried until answered, ctx
// ends or the Node closes; the rest is finished in the background (abandoned once closed).
func (c *coordTxn) apply(ctx context.Context, d txncoord.Decision) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	answered := 0
	left := false
	for i, p := range c.prepared {
		if p == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				var err error
				hook("applying", i)
				if d == decisionUncertain {
					_, err = p.ApplyUncertain(ctx)
				} else {
					err = p.Apply(ctx, d)
				}
				if errors.Is(err, txnode.ErrClosed) && c.n.closedErr() == nil {
					// Its transaction node died and was closed (heal.go replaced it):
					// no Apply over it ever succeeds. The storage node's resolver
					// settles the part (the decision is, or will be, recorded at the
					// primary); the cache it locked is gone with that transaction node.
					p.Abandon()
					err = nil
				}
				if err == nil || errors.Is(err, txnode.ErrTxnDecided) || errors.Is(err, txnode.ErrTxDone) {
					c.prepared[i] = nil
					mu.Lock()
					answered++
					k := answered
					mu.Unlock()
					hook("applied", k)
					return
				}
				// Close ends the Node's transaction nodes: an Apply over them never succeeds
				// again, so the part is handed on (and abandoned there) at once.
				if ctx.Err() != nil || c.n.closedErr() != nil || !pause(ctx, coordRetry) {
					mu.Lock()
					left = true
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if left {
		c.n.finishLater(c, d)
	}
}

// pause waits d or until ctx ends; it reports whether d passed.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// finishLater finishes c in the background, under the Node's context (Close ends it): the
// same Decide(commit) until answered when d is DecisionNone, then the decision applied to
// every part left. A part left when Close comes is abandoned (its rows dropped from the
// cache): its storage node's resolver finishes it.
func (n *Node) finishLater(c *coordTxn, d txncoord.Decision) {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		c.abandon()
		return
	}
	n.finishing.Add(1)
	n.mu.Unlock()
	go func() {
		defer n.finishing.Done()
		ctx := n.bg
		if d == txncoord.DecisionNone {
			var err error
			if d, err = c.decide(ctx); err != nil {
				return // decide handed it on again, or the Node is closing: abandoned there
			}
		}
		if d == decisionUncertain {
			n.log.Warn("node: two-phase commit: the primary answered abort after a commit decision long unanswered: the outcome is unknown", "txn", fmt.Sprintf("%x", c.id))
		}
		c.apply(ctx, d)
		if ctx.Err() != nil {
			c.abandon()
		}
	}()
}

// abandon gives up every part left (the Node is closing).
func (c *coordTxn) abandon() {
	for i, p := range c.prepared {
		if p != nil {
			p.Abandon()
			c.prepared[i] = nil
		}
	}
}
