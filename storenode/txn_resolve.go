package storenode

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/weftdb/weft/base"
)

// The resolver's pass (ResolveTxns): which parts it takes, in which order it calls their
// primaries, and how a primary that failed is skipped for a while.
//
// Invariants:
//   - A pass takes at most txnTasksMax tasks, round-robin over the parts' owners (each
//     owner's next task in turn), so one owner's parts cannot fill the pass.
//   - Its runs (one per primary) start in the order the round-robin first met their
//     primary, at most Options.TxnResolvePrimariesMax at once: another owner's primary is
//     among the first runs started, whatever the addresses of one owner's primaries.
//   - A primary whose run failed (a call's error or timeout, the pass's context alive) is
//     skipped, its parts left out of the passes, until its backoff ends: txnBackoffMin after
//     the first failure, doubled by each consecutive one up to txnBackoffMax (engine clock);
//     a run that completes clears it. After a backoff a pass retries at most
//     txnProbesMax(Options.TxnResolvePrimariesMax) primaries that failed last time, so N
//     unresponsive primaries cost a pass at most one TxnCallTimeout, not N/max.
//   - No run but the first starts later than one TxnCallTimeout into the pass (the runs
//     left go in the next pass, kicked at once), so fresh unresponsive primaries (new
//     addresses) cost a pass about one TxnCallTimeout, not one per TxnResolvePrimariesMax
//     of them, and do not hold up the next passes either.
//   - e.txnBackoff holds only primaries some kept part names (pruned by every pass): at
//     most one entry per part.

// txnTask is one resolver step for a part: ask the primary (prepared) or report (applied).
type txnTask struct {
	id      base.TxnID
	lease   int64
	primary string
	index   uint16
	owner   uint64 // the prepared batch's owner; 0 for an applied part (its batch is gone)
	applied base.Decision
	done    bool // reported: the part is forgotten at the pass's end (forgetReported)
}

// txnTasksMax bounds one resolver pass.
const txnTasksMax = 256

// A primary's backoff after its first failed run, and its bound.
const (
	txnBackoffMin = time.Second
	txnBackoffMax = 32 * time.Second
)

// txnBackoff is a primary's run of failed resolver calls. Guarded by mu.
type txnBackoff struct {
	fails int       // consecutive failed runs
	until time.Time // engine clock: its parts are left out of the passes until then
	seen  uint64    // the last pass that found a part naming it (pruning)
}

// txnBackoffFor is the backoff after fails consecutive failed runs.
func txnBackoffFor(fails int) time.Duration {
	d := txnBackoffMin
	for i := 1; i < fails && d < txnBackoffMax; i++ {
		d *= 2
	}
	return min(d, txnBackoffMax)
}

// txnProbesMax is how many primaries that failed last time one pass retries.
func txnProbesMax(primariesMax int) int { return max(1, primariesMax/2) }

// ResolveTxns runs one resolver pass: for every part prepared for at least
// Options.TxnResolveAfter (engine clock), ask its primary and apply the answer; for every
// applied part, report to its primary and forget it once the primary acknowledged. Each call
// to a primary is bounded by Options.TxnCallTimeout and ctx; no lock is held across it. One
// primary's tasks run one after another, stopping at its first failure (the primary is then
// skipped for a growing time, see the file's invariants); distinct primaries run
// concurrently on goroutines of the pass, at most Options.TxnResolvePrimariesMax at once,
// all ended with ctx. It returns ctx's error if ctx ended, else the first failed run's
// error in the pass's order (the pass goes on past it). The background loop calls it every
// Options.TxnResolveInterval; tests call it directly.
func (e *Engine) ResolveTxns(ctx context.Context) error {
	e.mu.Lock()
	if err := e.usable(); err != nil {
		e.mu.Unlock()
		return err
	}
	if e.checkLeader() != nil {
		e.mu.Unlock()
		return nil // a follower's parts are resolved by the leader's entries (txn_repl.go)
	}
	tasks := e.resolveTasks(e.opts.Now())
	if e.replicated() {
		e.proposeTxnExpiry() // the leader's sweep, applied by every replica (txn_repl.go)
	}
	e.sweepTxnDecisions() // a replica's: none
	e.mu.Unlock()
	if len(tasks) == 0 {
		return nil
	}
	// By primary, in the order first met.
	var runs [][]txnTask
	at := make(map[string]int)
	for _, t := range tasks {
		i, ok := at[t.primary]
		if !ok {
			i = len(runs)
			at[t.primary] = i
			runs = append(runs, nil)
		}
		runs[i] = append(runs[i], t)
	}
	errs := make([]error, len(runs))
	failed, started := make([]bool, len(runs)), make([]bool, len(runs))
	left := false // runs not started within the pass's budget
	if len(runs) == 1 {
		started[0] = true
		failed[0], errs[0] = e.resolveRun(ctx, runs[0])
	} else {
		slots := make(chan struct{}, e.opts.TxnResolvePrimariesMax)
		var wg sync.WaitGroup
		begun := time.Now()
	start:
		for i, run := range runs {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				break start
			}
			if i > 0 && time.Since(begun) >= e.opts.TxnCallTimeout {
				// The budget: no run starts later than one TxnCallTimeout into the pass (a
				// slot freed that late, its call timed out); the rest go in the next pass.
				<-slots
				left = true
				break start
			}
			started[i] = true
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-slots }()
				failed[i], errs[i] = e.resolveRun(ctx, run)
			}()
		}
		wg.Wait()
	}
	e.noteRuns(runs, errs, failed, started)
	if left {
		e.kickResolver()
	}
	tasks = tasks[:0]
	for _, run := range runs {
		tasks = append(tasks, run...)
	}
	if e.forgetReported(tasks) > 0 && len(tasks) == txnTasksMax {
		e.kickResolver() // a backlog (a restart's, a burst): the next pass now, not in a second
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// resolveTasks picks a pass's tasks (see the file's invariants) and prunes e.txnBackoff.
// Caller holds mu.
func (e *Engine) resolveTasks(now time.Time) []txnTask {
	e.txnPass++
	byOwner := make(map[uint64][]txnTask)
	for _, p := range e.txnParts {
		b := e.txnBackoff[p.primary]
		if b != nil {
			b.seen = e.txnPass
		}
		if p.decision == base.DecisionNone && now.Sub(p.at) < e.opts.TxnResolveAfter {
			continue
		}
		if p.decision != base.DecisionNone && p.lsn > e.durableThrough() {
			// Applied, the apply record not synced yet (ApplyTxn waits for it): a report now
			// could let the primary forget a decision a crash would make this part ask for.
			continue
		}
		if b != nil && now.Before(b.until) {
			continue
		}
		var owner uint64
		if p.decision == base.DecisionNone {
			owner = p.batch.Owner
		}
		if len(byOwner[owner]) == txnTasksMax {
			continue // more than one pass takes of one owner
		}
		byOwner[owner] = append(byOwner[owner], txnTask{id: p.id, lease: p.lease, primary: p.primary,
			index: p.index, owner: owner, applied: p.decision})
	}
	for primary, b := range e.txnBackoff {
		if b.seen != e.txnPass {
			delete(e.txnBackoff, primary)
		}
	}
	if len(byOwner) == 0 {
		return nil
	}
	owners := make([]uint64, 0, len(byOwner))
	for o, ts := range byOwner {
		owners = append(owners, o)
		slices.SortFunc(ts, func(a, b txnTask) int {
			return cmp.Or(strings.Compare(a.primary, b.primary), slices.Compare(a.id[:], b.id[:]))
		})
	}
	slices.Sort(owners)
	// Round-robin: each owner's next task in turn; a primary that failed last time is taken
	// only while the pass retries fewer than txnProbesMax of them.
	probes, probesMax := make(map[string]bool), txnProbesMax(e.opts.TxnResolvePrimariesMax)
	var tasks []txnTask
	for len(tasks) < txnTasksMax && len(owners) > 0 {
		left := owners[:0]
		for _, o := range owners {
			ts := byOwner[o]
			for len(ts) > 0 && len(tasks) < txnTasksMax {
				t := ts[0]
				ts = ts[1:]
				if b := e.txnBackoff[t.primary]; b != nil && !probes[t.primary] {
					if len(probes) == probesMax {
						continue // its turn in a later pass
					}
					probes[t.primary] = true
				}
				tasks = append(tasks, t)
				break
			}
			if byOwner[o] = ts; len(ts) > 0 {
				left = append(left, o)
			}
		}
		owners = left
	}
	return tasks
}

// noteRuns records the pass's started runs in e.txnBackoff: a failed run's primary backs
// off longer, a completed run's primary is cleared.
func (e *Engine) noteRuns(runs [][]txnTask, errs []error, failed, started []bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.opts.Now()
	for i, run := range runs {
		primary := run[0].primary
		switch {
		case !started[i]: // its backoff stays
		case failed[i]:
			if e.txnBackoff == nil {
				e.txnBackoff = make(map[string]*txnBackoff)
			}
			b := e.txnBackoff[primary]
			if b == nil {
				b = &txnBackoff{}
				e.txnBackoff[primary] = b
			}
			b.fails++
			b.until, b.seen = now.Add(txnBackoffFor(b.fails)), e.txnPass
		case errs[i] == nil: // every call answered
			delete(e.txnBackoff, primary)
		}
	}
}

// resolveRun resolves the tasks of one primary, one after another, until one fails or ctx
// ends; it returns that error, and whether the primary failed (its call's error or timeout,
// ctx alive).
func (e *Engine) resolveRun(ctx context.Context, run []txnTask) (bool, error) {
	for i := range run {
		t := &run[i]
		if err := ctx.Err(); err != nil {
			return false, err
		}
		if peer, err := e.resolveOne(ctx, t); err != nil {
			return peer && ctx.Err() == nil, fmt.Errorf("storenode: resolve %v: %w", t.id, err)
		}
	}
	return false, nil
}

// resolveOne runs one task; the bool tells an error of the primary's call (not of this
// node's apply) from others.
func (e *Engine) resolveOne(ctx context.Context, t *txnTask) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, e.opts.TxnCallTimeout)
	defer cancel()
	remote := t.primary != ""
	if t.applied == base.DecisionNone {
		var d base.Decision
		var err error
		if !remote {
			d, err = e.AskTxn(ctx, t.id, t.lease)
		} else if e.opts.TxnPeer != nil {
			d, err = e.opts.TxnPeer.AskTxn(ctx, t.primary, t.id, t.lease)
		} else {
			return false, errNoTxnPeer(t.primary)
		}
		if err != nil {
			return remote, err
		}
		if d == base.DecisionNone {
			return false, nil
		}
		if err := e.ApplyTxn(t.id, d); err != nil {
			return false, err
		}
		e.stats.txnResolved.Add(1)
		t.applied = d
	}
	var err error
	if !remote {
		err = e.ReportTxn(t.id, t.index)
	} else if e.opts.TxnPeer != nil {
		err = e.opts.TxnPeer.ReportTxn(ctx, t.primary, t.id, t.index)
	} else {
		return false, errNoTxnPeer(t.primary)
	}
	if err != nil {
		return remote, err
	}
	t.done = true
	return false, nil
}

func errNoTxnPeer(primary string) error {
	return fmt.Errorf("storenode: no TxnPeer to reach the primary %s", primary)
}
