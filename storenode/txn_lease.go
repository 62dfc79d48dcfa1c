package storenode

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// The lease checks of Decides (issue 22's hostile review, defect 8): a Decide{commit} of a
// part prepared here asks etcd whether the coordinator's lease is alive (LeaseChecker), and
// one client resending the Decide of one part could hold as many checks at once as it had
// requests in flight. So:
//
//   - a Decide's check takes a verification slot as a grant registration does
//     (verify_slots.go): at most grantVerifyConnMax per connection, refused at once with
//     ErrTxnBusy when the connection may take none (the engine's own callers, conn 0, wait);
//   - concurrent Decides of the same lease share one check (leaseChecks): a Decide that
//     finds a check of its lease running waits for its answer (bounded by its context), and
//     takes no slot. A check is registered only once it holds its slot, so a refused caller
//     never makes another's Decide fail.

// leaseCheck is one LeaseChecker call, shared by the Decides of its lease.
type leaseCheck struct {
	done  chan struct{} // closed once alive and err are set
	at    time.Time     // engine clock, when the check started
	alive bool
	err   error
}

// leaseChecks are the lease checks running, by lease.
type leaseChecks struct {
	mu      sync.Mutex
	running map[int64]*leaseCheck // no entry when none runs
	joined  func()                // tests: called (under mu) when a Decide joins a running check
}

// joinLocked returns the running check of lease, or nil. Caller holds l.mu.
func (l *leaseChecks) joinLocked(lease int64) *leaseCheck {
	c := l.running[lease]
	if c != nil && l.joined != nil {
		l.joined()
	}
	return c
}

// join is joinLocked taking l.mu.
func (l *leaseChecks) join(lease int64) *leaseCheck {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.joinLocked(lease)
}

// wait waits for c's answer while ctx lasts.
func (c *leaseCheck) wait(ctx context.Context) (bool, time.Time, error) {
	select {
	case <-c.done:
		return c.alive, c.at, c.err
	case <-ctx.Done():
		return false, time.Time{}, ctx.Err()
	}
}

// checkDecideLease asks the LeaseChecker whether lease is alive, for a Decide from
// connection conn (0: the engine's own caller), and returns the answer and when (engine
// clock) the check started. See the file doc. No lock held.
func (e *Engine) checkDecideLease(ctx context.Context, conn uint64, lease int64) (bool, time.Time, error) {
	l := &e.leaseChecks
	if c := l.join(lease); c != nil {
		return c.wait(ctx)
	}
	if err := e.takeVerifySlot(ctx, conn); err != nil {
		if errors.Is(err, ErrClosed) {
			return false, time.Time{}, err
		}
		return false, time.Time{}, fmt.Errorf("%w: lease check: %v", ErrTxnBusy, err)
	}
	defer e.releaseVerifySlot(conn)
	l.mu.Lock()
	if c := l.joinLocked(lease); c != nil {
		l.mu.Unlock()
		return c.wait(ctx) // started while this one took its slot
	}
	c := &leaseCheck{done: make(chan struct{}), at: e.opts.Now()}
	if l.running == nil {
		l.running = make(map[int64]*leaseCheck)
	}
	l.running[lease] = c
	l.mu.Unlock()
	c.alive, c.err = e.opts.LeaseChecker.LeaseAlive(ctx, lease)
	l.mu.Lock()
	delete(l.running, lease)
	l.mu.Unlock()
	close(c.done)
	return c.alive, c.at, c.err
}
