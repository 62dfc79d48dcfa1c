package server

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Stopping a server: Shutdown drains the requests in flight (inflightTracker), stops the
// transport, then checkpoints and closes the engine.

// Shutdown stops the server gracefully: it stops taking connections and requests (both are
// answered with ErrShuttingDown), waits for the requests in flight to be answered (commits
// included: every batch it accepted is durable or failed, and its reply written), closes the
// connections, then checkpoints and closes the engine (or only checkpoints an engine given in
// Config.Engine). When ctx ends first, connections are closed with requests still in
// flight and the engine is closed at once; the error then wraps ctx's. Shutdown is
// idempotent: later calls wait for the first and return its result.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if s.stopped || !s.started {
		first := !s.started && !s.stopped
		s.stopped = true
		s.mu.Unlock()
		if first {
			close(s.done)
			return nil
		}
		<-s.done
		return s.stopErr
	}
	s.stopped = true
	s.mu.Unlock()

	start := time.Now()
	s.log.Info("storenode: shutting down", "requests_in_flight", s.requests.count())
	drainErr := s.requests.drain(ctx)
	if drainErr != nil {
		s.log.Warn("storenode: shutdown deadline: closing connections with requests in flight",
			"requests_in_flight", s.requests.count(), "err", drainErr)
	}
	s.stopTransport()
	var err error
	if drainErr == nil {
		s.workers.Wait()
		if s.ownsEngine {
			err = s.eng.Close()
		} else {
			err = s.eng.Checkpoint()
		}
	} else {
		// Wake commits that wait (for a seq gap, for cache room) before waiting for them.
		if s.ownsEngine {
			err = s.eng.Close()
		}
		s.workers.Wait()
		err = errors.Join(fmt.Errorf("storenode: shutdown: %w", drainErr), err)
	}
	if err != nil {
		s.log.Error("storenode: shutdown", "err", err)
	} else {
		s.log.Info("storenode: stopped", "took", time.Since(start))
	}
	s.stopErr = err
	close(s.done)
	return err
}

// stopTransport stops listening and closes every connection.
func (s *Server) stopTransport() {
	if s.cfg.TLS != nil {
		s.stopTLS()
		return
	}
	s.stopGnet()
}

// inflightTracker counts requests received and not yet answered across the server, so that
// Shutdown can wait for them. begin fails once draining has begun.
//
// The order of operations makes the wait exact without a lock: begin adds, then checks
// draining; drain sets draining, then checks the count; end subtracts, then checks draining.
// With sequentially consistent atomics, either drain sees a begin's count or the begin sees
// draining (and takes its count back), and whoever takes the count to zero after draining
// began signals.
type inflightTracker struct {
	n        atomic.Int64
	draining atomic.Bool
	zero     chan struct{} // cap 1: the count reached zero while draining
	once     sync.Once
}

func (t *inflightTracker) init() { t.once.Do(func() { t.zero = make(chan struct{}, 1) }) }

func (t *inflightTracker) begin() bool {
	t.n.Add(1)
	if t.draining.Load() {
		t.end(1)
		return false
	}
	return true
}

func (t *inflightTracker) end(k int) {
	if k == 0 {
		return
	}
	if t.n.Add(int64(-k)) == 0 && t.draining.Load() {
		t.init()
		select {
		case t.zero <- struct{}{}:
		default:
		}
	}
}

func (t *inflightTracker) count() int64 { return t.n.Load() }

func (t *inflightTracker) isDraining() bool { return t.draining.Load() }

// drain stops new requests and waits until none is in flight or ctx ends.
func (t *inflightTracker) drain(ctx context.Context) error {
	t.init()
	t.draining.Store(true)
	for t.n.Load() != 0 {
		select {
		case <-t.zero:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
