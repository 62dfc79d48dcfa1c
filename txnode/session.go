package txnode

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Asynchronous commit, for game ticks: one goroutine keeps many transactions in flight. Go runs
// a transaction and commits it in memory (validated, installed, visible to other
// transactions) and returns at once; its Pending reports when it is durable.

// Session is one goroutine's handle for asynchronous commits. It is not safe for concurrent
// use: give each goroutine its own.
type Session struct {
	db *DB
	// lastVer is the highest commit version the session's transactions have waited for:
	// a later pending resolves no earlier, and Flush waits for it.
	lastVer uint64
}

// Session returns a new session.
func (db *DB) Session() *Session { return &Session{db: db} }

// Pending is an asynchronously committed transaction.
type Pending struct {
	db   *DB
	wait commitWait
	err  error
	// errAfter: err is the closure's own error, reported once what the closure read is
	// durable (wait, in Durable mode), as DB.Update does.
	errAfter bool
	done     chan struct{}
}

// Go runs fn in a read-write transaction and commits it in memory, retrying conflicts like
// DB.Update (fn may run more than once), and returns at once. The transaction's effects are
// visible to every later transaction; Pending.Wait reports when it is durable. A session's
// pendings resolve in the order it issued them. fn's own error is Pending.Wait's, reported as
// DB.Update reports it (once what fn read is durable). As in DB.Update, a panic in fn rolls the
// transaction back and goes on up the caller's goroutine, and tx is valid only while fn runs.
func (s *Session) Go(ctx context.Context, fn func(tx *Tx) error) *Pending {
	p := &Pending{db: s.db}
	var busySince time.Time
	var running *Tx // the transaction a panic in fn would leave behind
	turn := false   // holds the cache turn (retryBusy)
	defer func() {
		if running != nil {
			running.Rollback()
		}
		if turn {
			s.db.cache.giveTurn()
		}
	}()
	for attempt := 0; ; {
		tx, err := s.db.beginTx(ctx, true)
		if err != nil {
			p.err = err
			break
		}
		running, tx.exposed = tx, true
		tx.turn = turn
		err = fn(tx)
		running = nil
		if tx.busy.t != nil {
			if err := tx.retryBusy(&busySince, &turn); err != nil {
				p.err = err
				break
			}
			continue
		}
		if err != nil {
			readVer := tx.maxRead
			err = tx.abort(err)
			if err == ErrConflict && attempt < s.db.opts.MaxRetries {
				attempt++
				s.db.stats.retries.Add(1)
				continue
			}
			p.err = err
			if err != ErrConflict {
				// The closure's own error may rest on rows of a commit not yet durable: Wait
				// reports it once they are (see DB.Update), in the session's order.
				p.errAfter = true
				p.wait = commitWait{ver: max(readVer, s.lastVer), after: true, ordered: true}
				s.lastVer = p.wait.ver
			}
			break
		}
		cw, err := tx.commit()
		tx.release()
		if errors.Is(err, ErrConflict) && attempt < s.db.opts.MaxRetries {
			attempt++
			s.db.stats.retries.Add(1)
			continue
		}
		p.err = err
		p.wait = cw
		break
	}
	// A read-only transaction resolves after the session's earlier writes (a pending that
	// failed holds no version: the ones before it still count).
	if p.err == nil {
		p.wait.ver = max(p.wait.ver, s.lastVer)
		p.wait.after = !p.wait.write
		p.wait.ordered = true
		s.lastVer = p.wait.ver
	}
	return p
}

// Wait returns nil once the transaction is durable (in WriteBack: flushed), or its error.
// If ctx ends first it returns an error wrapping ErrUnknownOutcome. The closure's own error
// is returned as DB.Update returns it: in Durable mode only once what the closure read is
// durable; if a batch it read from failed, Wait returns that failure instead (what the
// closure saw never happened; the node stops committing), and if ctx ends first, ctx's error
// (nothing was applied).
func (p *Pending) Wait(ctx context.Context) error {
	if p.errAfter {
		if err := p.wait.wait(p.db, ctx); err != nil {
			return err
		}
		return p.err
	}
	if p.err != nil {
		return p.err
	}
	err := p.wait.waitDurable(p.db, ctx)
	if err != nil && ctx.Err() != nil && !errors.Is(err, ErrUnknownOutcome) {
		err = fmt.Errorf("%w: %w", ErrUnknownOutcome, err)
	}
	return err
}

// Done returns a channel closed when the transaction is durable or failed; then Wait returns
// at once.
func (p *Pending) Done() <-chan struct{} {
	if p.done == nil {
		p.done = make(chan struct{})
		if p.err != nil && (!p.errAfter || p.db.opts.Durability == WriteBack) || p.wait.ver <= p.db.durableVer.Load() {
			close(p.done)
		} else {
			go func() {
				_ = p.wait.waitDurable(p.db, context.Background()) // a held write: its answer
				close(p.done)
			}()
		}
	}
	return p.done
}

// Flush waits until every transaction committed on db before the call (by any session) is
// durable; in WriteBack mode it flushes them now. It returns the error that keeps them from it
// (a failed batch, the DB closed) or ctx's error if ctx ends first (their outcome then is
// unknown to the caller: each transaction's own Pending or Update tells).
func (db *DB) Flush(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	// The target before the flush is asked for: a commit after the flusher's cut but before
	// the read would set a target that flush does not cover (pipeline.flush's cutReq).
	ver := db.commitVer.Load()
	if db.opts.Durability == WriteBack {
		db.pipe.flushSoon()
	} else {
		db.pipe.kickNow()
	}
	return db.waitDurable(ctx, ver)
}

// Flush waits until every transaction the session committed is durable. It returns the
// error that keeps them from it (a failed batch) or one wrapping ErrUnknownOutcome if ctx
// ends first; a closure's error stays with its own Pending.
func (s *Session) Flush(ctx context.Context) error {
	if s.db.opts.Durability == WriteBack {
		s.db.pipe.flushSoon()
	} else {
		s.db.pipe.kickNow()
	}
	p := Pending{db: s.db, wait: commitWait{ver: s.lastVer, write: true, ordered: true}}
	err := p.Wait(ctx)
	if err == nil && s.db.opts.Durability == Durable {
		if ferr := s.db.verFailed(s.lastVer); ferr != nil {
			// The last commit's batch was held (recover.go) and acknowledged, but an earlier
			// one of the session may have been in the refused batch: each Pending knows.
			err = fmt.Errorf("%w: the session's last commit was applied after an earlier commit batch was refused (%v): its earlier ones may not have been; see each Pending",
				ErrUnknownOutcome, ferr)
		}
	}
	return err
}
