package txnode

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/weftdb/weft/internal/assert"
)

// The durable version: committers and readers wait for it (waitVer), the pipeline advances it
// or fails it; a refused batch's versions are a failed range, and the batches in flight after
// it are held until their own answer (heldVers).

// durableWaiter is a goroutine in waitDurable. Waiters come from a pool and their channels
// are reused, so waiting allocates nothing: a waiter is woken (one send; the channel holds
// one) only after it was registered, and registered again only after it took the wake-up.
type durableWaiter struct {
	ver uint64
	ch  chan struct{}
}

var durableWaiterPool = sync.Pool{New: func() any { return &durableWaiter{ch: make(chan struct{}, 1)} }}

// waitDurable waits until every commit with version <= ver is acknowledged, or returns the
// pipeline's failure, the error of the failed range holding ver (verFailed), or ctx.Err().
func (db *DB) waitDurable(ctx context.Context, ver uint64) error {
	return db.waitVer(ctx, ver, 0, waitRead)
}

// waitCommitted is waitDurable for the committer of version ver, whose transaction read
// versions up to readVer: while ver is held (its batch was in flight after a refused one,
// recover.go) it waits for that batch's answer instead of returning the failed range's
// error at once, since a store that forgot the refusal may still apply the batch; then it
// returns the answer (heldVers.answer).
func (db *DB) waitCommitted(ctx context.Context, ver, readVer uint64) error {
	return db.waitVer(ctx, ver, readVer, waitCommit)
}

// waitOrdered is waitDurable for a Session's read-only Pending, which resolves no earlier
// than the session's write before it: while ver is held it waits for the batch's answer,
// then returns what waitDurable does (a failed range's error).
func (db *DB) waitOrdered(ctx context.Context, ver uint64) error {
	return db.waitVer(ctx, ver, 0, waitAfter)
}

// waitMode is what a wait in a failed range does with a held version (heldVers).
type waitMode uint8

const (
	waitRead   waitMode = iota // returns the range's error at once
	waitCommit                 // waits for the batch's answer and returns it
	waitAfter                  // waits for the batch's answer, then returns the range's error
)

func (db *DB) waitVer(ctx context.Context, ver, readVer uint64, mode waitMode) error {
	if db.durableVer.Load() >= ver {
		// verFailed is loaded after durableVer: a recovery adds its range first.
		if err := db.verFailed(ver); err == nil || mode == waitRead {
			return err
		}
	}
	w := durableWaiterPool.Get().(*durableWaiter)
	defer durableWaiterPool.Put(w)
	w.ver = ver
	for {
		db.durableMu.Lock()
		if err := db.verFailed(ver); err != nil {
			var h *heldVers
			if mode != waitRead {
				h = db.heldLocked(ver)
			}
			if h == nil || h.answered && mode == waitAfter { // not held (or refused)
				db.durableMu.Unlock()
				return err
			}
			if h.answered {
				ans := h.answer(ver, readVer)
				db.durableMu.Unlock()
				return ans
			}
			// Held and out: releaseHeld wakes it (so may others: it looks again).
		} else if db.durableVer.Load() >= ver {
			db.durableMu.Unlock()
			return nil
		} else if ver >= db.durableFailVer {
			// A batch before ver failed the pipeline for good; ver's own batch may still be
			// held (a refusal while closing, or past failRangesMax: recover.go).
			var h *heldVers
			if mode != waitRead {
				h = db.heldLocked(ver)
			}
			if h == nil || h.answered && mode == waitAfter {
				db.durableMu.Unlock()
				return db.pipe.failure()
			}
			if h.answered {
				ans := h.answer(ver, readVer)
				db.durableMu.Unlock()
				return ans
			}
		}
		db.durableWaiters = append(db.durableWaiters, w)
		db.durableMu.Unlock()
		db.pipe.kickNow()
		if db.testHookWait != nil {
			db.testHookWait("durable")
		}
		woken := false
		select {
		case <-w.ch:
			woken = true
		case <-ctx.Done():
		case <-db.outageC():
			// The storage node is unavailable: the batch is kept and resent on reconnect,
			// but nobody waits an outage out here.
		}
		if !woken {
			db.durableMu.Lock()
			if i := slices.Index(db.durableWaiters, w); i >= 0 {
				db.durableWaiters = slices.Delete(db.durableWaiters, i, i+1)
			} else {
				<-w.ch // woken meanwhile: take the wake-up, so the channel is empty for reuse
			}
			db.durableMu.Unlock()
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := db.unavailableErr(); err != nil {
				return err
			}
			// The outage ended meanwhile: look again.
		}
	}
}

// wakeLocked wakes w, which is registered and so has not been woken yet. Caller holds
// durableMu.
func (w *durableWaiter) wakeLocked() {
	select {
	case w.ch <- struct{}{}:
	default:
		assert.Failf("txnode: durable waiter woken twice")
	}
}

// advanceDurable raises durableVer and wakes the waiters it satisfies.
func (db *DB) advanceDurable(ver uint64) {
	db.durableMu.Lock()
	if ver > db.durableVer.Load() {
		db.durableVer.Store(ver)
		db.wakeDurableLocked(0, ver)
	}
	db.durableMu.Unlock()
}

// wakeDurableLocked wakes the durable waiters for versions lo..hi and drops them from
// durableWaiters. durableMu is held.
func (db *DB) wakeDurableLocked(lo, hi uint64) {
	keep := db.durableWaiters[:0]
	for _, w := range db.durableWaiters {
		if w.ver >= lo && w.ver <= hi {
			w.wakeLocked()
		} else {
			keep = append(keep, w)
		}
	}
	clear(db.durableWaiters[len(keep):])
	db.durableWaiters = keep
}

// failDurable records that no version from fromVer on will become durable (a batch failed)
// and wakes the waiters for them, which return the pipeline's failure.
func (db *DB) failDurable(fromVer uint64) {
	db.batchFailed.Store(true)
	db.durableMu.Lock()
	db.durableFailVer = min(db.durableFailVer, fromVer)
	db.wakeDurableLocked(db.durableFailVer, math.MaxUint64)
	db.durableMu.Unlock()
}

// heldVers are the versions of a batch that was in flight after a refused one (recover.go):
// the failed range fails their readers at once, but their committers wait for the batch's
// answer, since a storage node that forgot the refusal (refusals are kept in memory only,
// and bounded) may apply it.
type heldVers struct {
	lo, hi uint64
	// answered: the batch is back, or never will be (Close gave up on it). A batch refused
	// (not applied) is no longer held: its committers get the range's error.
	answered bool
	// err is the answer; nil: acknowledged, applied and durable (see okBelow).
	err error
	// okBelow (acknowledged): the lowest version of a batch before it that was not applied
	// or whose outcome is unknown: a transaction that read a version from it on read rows
	// that may never have been applied.
	okBelow uint64
}

// answer is what the committer of version ver, whose transaction read versions up to
// readVer, gets for the answered batch h.
func (h *heldVers) answer(ver, readVer uint64) error {
	if h.err != nil || readVer < h.okBelow {
		return h.err
	}
	return fmt.Errorf("%w: commit version %d was applied by the store after an earlier batch of this node was refused, but the transaction read version %d, which may not have been: do not run it again unless it is idempotent",
		ErrUnknownOutcome, ver, readVer)
}

// heldMax bounds db.held: a refusal holds at most inflightMax batches, an entry goes
// once its batch is refused, and one stays answered only once the pipeline failed for good.
const heldMax = 2 * inflightMax

// heldLocked returns the held batch holding ver, nil when none. Caller holds durableMu.
func (db *DB) heldLocked(ver uint64) *heldVers {
	for i := range db.held {
		if h := &db.held[i]; ver >= h.lo && ver <= h.hi {
			return h
		}
	}
	return nil
}

// holdVers records lo..hi as held: their committers wait for releaseHeld. Called under the
// pipeline's mu, before the failed range holding them is recorded.
func (db *DB) holdVers(lo, hi uint64) {
	db.durableMu.Lock()
	db.held = append(db.held, heldVers{lo: lo, hi: hi})
	assert.That(len(db.held) <= heldMax, "txnode: too many held commit batches")
	db.durableMu.Unlock()
}

// releaseHeld answers the committers of the held versions lo..hi and wakes them: refused,
// they get the failed range's error (the hold is dropped); else ans (nil: acknowledged, with
// okBelow: see heldVers). The hold is found by lo alone: a part applied since (prepare.go's
// installApplied) may have raised the batch's lastVer past the hold's hi. Called under the
// pipeline's mu.
func (db *DB) releaseHeld(lo, hi uint64, refused bool, ans error, okBelow uint64) {
	db.durableMu.Lock()
	defer db.durableMu.Unlock()
	for i := range db.held {
		if h := &db.held[i]; h.lo == lo && !h.answered {
			if refused {
				db.held = slices.Delete(db.held, i, i+1)
			} else {
				h.answered, h.err, h.okBelow = true, ans, okBelow
			}
			break
		}
	}
	db.wakeDurableLocked(lo, hi)
}

// verRange is a range of commit versions that failed: their batches were refused by the
// store (not applied) and the pipeline went on (pipeline.recover).
type verRange struct {
	lo, hi uint64
	err    error
}

// failRangesMax bounds the failed ranges a DB keeps: a refusal past it fails the pipeline for
// good, as any failed batch did before recoveries (reopen the DB).
const failRangesMax = 64

// verFailed returns the error of the failed range holding ver, nil when none. Lock-free; any
// goroutine. A caller that found ver durable must load durableVer before calling it.
func (db *DB) verFailed(ver uint64) error {
	if ver > db.failHi.Load() {
		return nil
	}
	if rs := db.failRanges.Load(); rs != nil {
		for _, r := range *rs {
			if ver >= r.lo && ver <= r.hi {
				return r.err
			}
		}
	}
	return nil
}

// failedFloor returns ver, or, while ver is in a failed range, the version below that range.
func (db *DB) failedFloor(ver uint64) uint64 {
	for ver > 0 && ver <= db.failHi.Load() {
		rs := db.failRanges.Load()
		if rs == nil {
			break
		}
		moved := false
		for _, r := range *rs {
			if ver >= r.lo && ver <= r.hi {
				ver, moved = r.lo-1, true
			}
		}
		if !moved {
			break
		}
	}
	return ver
}

// failRange records that the versions lo..hi will never be durable, though durableVer may
// pass them (the pipeline recovers), and wakes their waiters, which return err. It reports
// false, recording nothing, when failRangesMax ranges are kept already.
func (db *DB) failRange(lo, hi uint64, err error) bool {
	db.durableMu.Lock()
	defer db.durableMu.Unlock()
	var rs []verRange
	if old := db.failRanges.Load(); old != nil {
		if len(*old) >= failRangesMax {
			return false
		}
		rs = append(rs, *old...)
	}
	rs = append(rs, verRange{lo: lo, hi: hi, err: err})
	db.failRanges.Store(&rs)
	db.failHi.Store(max(db.failHi.Load(), hi))
	db.wakeDurableLocked(lo, hi)
	return true
}
