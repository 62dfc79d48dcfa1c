package txnode

import (
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"time"

	"github.com/weftdb/weft/sgio"
)

// The remote store's reconnection: watching a connection, redialing with backoff, the outage
// (unavailable), resending the batches in flight, and which errors break a connection.

// watch waits for connection gen to break, then reconnects (redial), installs the new
// connection as the next generation and resends the batches in flight (resendInFlight). It
// runs on its own goroutine, one per connection, and ends at Close.
func (s *remoteStore) watch(c *sgio.Client, gen uint64) {
	<-c.Done()
	// Wait for the broken connection's sender to stop before anything is resent: it may
	// still be gathering a batch's rows into its last write, and a resent batch acknowledged
	// on the new connection is recycled, its buffer written by the next commits (a race the
	// detector found in TestClientSideDropMidLoad). Close returns once both of its goroutines
	// have exited; they exit promptly once the connection is dead.
	c.Close()
	s.mu.Lock()
	if s.closed || s.gen != gen {
		s.mu.Unlock()
		return
	}
	s.dialing = true
	s.lostAt = time.Now()
	s.dialErr = c.Err()
	inFlight := len(s.pendingLocked())
	s.mu.Unlock()
	s.opts.Logger.Warn("txnode: lost the storage node; reconnecting until it is back (requests wait up to RequestTimeout, then fail with ErrUnavailable)",
		"addr", s.opts.StoreAddr, "err", c.Err(), "batches in flight", inFlight)
	nc := s.redial(gen)
	if nc == nil {
		return // closed while dialing
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		nc.Close()
		return
	}
	s.gen++
	s.genA.Store(s.gen)
	s.conn = nc
	if s.unavail {
		open := make(chan struct{}) // first: a waiter that sees unavailA clear waits on it
		s.outage.Store(&open)
		s.unavail = false
		s.unavailA.Store(false)
	}
	s.dialErr = nil
	g, lost := s.gen, time.Since(s.lostAt)
	s.mu.Unlock()
	resent := s.resendInFlight(nc, g)
	s.opts.Logger.Info("txnode: the storage node is back", "addr", s.opts.StoreAddr,
		"after", lost.Round(time.Millisecond), "resent batches", resent)
	s.mu.Lock()
	back := s.onBack
	s.mu.Unlock()
	if back != nil {
		back()
	}
	go s.watch(nc, g)
}

// The backoff between redials: jittered (a half to the whole of it), doubling from the first
// to the last.
const (
	redialBackoffFirst = 10 * time.Millisecond
	redialBackoffMax   = 2 * time.Second
)

// redial dials the storage node again, backing off between attempts, until it answers or the
// store is closed (then it returns nil). An ErrOwnerInUse (another incarnation took the id
// after a lease of silence) is waited out like any other refusal. Once the outage has lasted
// RequestTimeout (seen between dials: a dial that hangs delays it by up to DialTimeout), the
// store becomes unavailable (markUnavailable). gen is the broken connection's generation. It
// runs on watch's goroutine and starts none (a goroutine per outage would outlive an
// unclosed DB's checks for leaks, and needs none).
func (s *remoteStore) redial(gen uint64) *sgio.Client {
	graceC, stopGrace := s.newTimer(s.opts.RequestTimeout)
	defer stopGrace()
	backoff := redialBackoffFirst
	for {
		nc, err := s.dial(s.life)
		if err == nil {
			return nc
		}
		if s.life.Err() != nil {
			return nil
		}
		s.mu.Lock()
		s.dialErr = err
		s.mu.Unlock()
		wait := backoff/2 + mrand.N(backoff/2+1)
		fired, stop := s.newTimer(wait)
		for waiting := true; waiting; {
			select {
			case <-fired:
				waiting = false
			case <-graceC:
				s.markUnavailable(gen)
				graceC = nil // never ready again
			case <-s.life.Done():
				stop()
				return nil
			}
		}
		backoff = min(2*backoff, redialBackoffMax)
	}
}

// newTimer is a timer that fires once after d, and its stop: Options' reconnectTimer in
// tests, time.NewTimer's otherwise.
func (s *remoteStore) newTimer(d time.Duration) (<-chan time.Time, func() bool) {
	if f := s.opts.reconnectTimer; f != nil {
		return f(d)
	}
	t := time.NewTimer(d)
	return t.C, t.Stop
}

// markUnavailable makes the store unavailable when the outage of connection gen still goes on:
// calls fail at once with ErrUnavailable, and the outage channel closes.
func (s *remoteStore) markUnavailable(gen uint64) {
	s.mu.Lock()
	if s.closed || s.gen != gen || !s.dialing || s.unavail {
		s.mu.Unlock()
		return
	}
	s.unavail = true
	s.unavailA.Store(true)
	close(*s.outage.Load())
	s.changed.Broadcast()
	f := s.onUnavailable
	s.mu.Unlock()
	if f != nil {
		f()
	}
}

// unavailableErr is ErrUnavailable, with the outage's length and the last dial's error, while
// the store is unavailable; nil otherwise. Lock-free when available.
func (s *remoteStore) unavailableErr() error {
	if !s.unavailA.Load() {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.unavailLocked()
}

func (s *remoteStore) unavailLocked() error {
	if !s.unavail {
		return nil
	}
	return fmt.Errorf("%w: %s unreachable for %v: %w", ErrUnavailable, s.opts.StoreAddr,
		time.Since(s.lostAt).Round(time.Millisecond), s.dialErr)
}

// disconnected reports whether a reconnect is in progress.
func (s *remoteStore) disconnected() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dialing
}

// outageC is closed while the store is unavailable. Any goroutine; lock-free.
func (s *remoteStore) outageC() <-chan struct{} { return *s.outage.Load() }

// resendInFlight resends the batches in flight on the new connection nc of generation g, in
// seq order, before any new batch goes out on it: the storage node applies a connection's
// commits in arrival order and holds a later seq back until the earlier ones arrive. Commit
// only queues while dialing is set, so batches committed meanwhile are taken by the next
// round; the last, empty round clears dialing. It returns how many batches it resent.
func (s *remoteStore) resendInFlight(nc *sgio.Client, g uint64) int {
	resent := 0
	for {
		s.mu.Lock()
		var round []*remoteCommit
		for _, rc := range s.commits.live() {
			if !rc.fin && rc.gen != g {
				rc.gen = g
				round = append(round, rc)
			}
		}
		if len(round) == 0 {
			s.dialing = false
			s.changed.Broadcast()
			s.mu.Unlock()
			return resent
		}
		for _, rc := range round {
			rc.sends++
		}
		s.mu.Unlock()
		for _, rc := range round {
			s.sendTracked(nc, g, rc)
		}
		resent += len(round)
	}
}

// retryable reports whether a request may be sent again on the next connection: the
// connection broke, or the storage node refused it because it is shutting down, or because
// the connection no longer holds this node's owner id (ErrIdentityLost: a reconnect replaced
// it, or the id was released; the connection is on its way out). In each the storage node did
// not execute it; a batch sent again is applied at most once anyway.
func retryable(err error) bool {
	return errors.Is(err, sgio.ErrConnClosed) || errors.Is(err, sgio.ErrShuttingDown) ||
		errors.Is(err, sgio.ErrIdentityLost)
}

// noteIdentityLost closes connection gen if err says it no longer holds this node's owner id
// and it is still the current one: a storage node closes a replaced connection itself, but a
// connection whose id was released stays open, and every request on it would be refused
// again. The close makes watch reconnect (claiming the id anew) and resend the batches in
// flight. It does not block (the close runs on a goroutine of its own), so a connection's
// receiver may call it. Identity loss is a connection problem: never a fence, nothing is
// latched.
func (s *remoteStore) noteIdentityLost(err error, gen uint64) {
	if err == nil || !errors.Is(err, sgio.ErrIdentityLost) {
		return
	}
	s.mu.Lock()
	c := s.conn
	current := s.gen == gen && c != nil // closing one already broken (a reconnect running) is harmless
	s.mu.Unlock()
	if current {
		s.opts.Logger.Warn("txnode: the storage node says this connection lost the owner id; reconnecting", "err", err)
		go c.Close()
	}
}
