package node

import (
	"context"
	"time"

	"github.com/weftdb/weft/cluster/internal/testhook"
)

// swapForTest sets *p to v and returns what restores the value it had.
func swapForTest[T any](p *T, v T) (restore func()) {
	old := *p
	*p = v
	return func() { *p = old }
}

// SetMoveStepHook sets the hook Move calls after each durable step (tests only).
func SetMoveStepHook(f func(step string)) { moveStepHook = f }

// SetCoordHook sets the two-phase commit's step hook (testhook.CoordStep) for a test and
// returns what restores it. Set it before any transaction runs.
func SetCoordHook(h func(step string, i int)) (restore func()) {
	var p *func(string, int)
	if h != nil {
		p = &h
	}
	old := testhook.CoordStep.Swap(p)
	return func() { testhook.CoordStep.Store(old) }
}

// SetSerialPrepares makes the two-phase commit prepare its participants one after another
// (coordSerialPrepares) and returns what restores it.
func SetSerialPrepares(on bool) (restore func()) {
	return swapForTest(&coordSerialPrepares, on)
}

// SetRaceHook sets raceHook (tests only) and returns what restores it.
func SetRaceHook(h func(where string)) (restore func()) {
	return swapForTest(&raceHook, h)
}

// KillDB makes the transaction node of the storage node at addr dead as a give-up would
// (its grants kept, as heal.go keeps them: DieDB), then uses the storage node (heal.go
// replaces it).
func KillDB(ctx context.Context, n *Node, addr string) error {
	if err := DieDB(ctx, n, addr); err != nil {
		return err
	}
	_, err := n.db(ctx, addr)
	return err
}

// SetDecideAnswer sets the hook that sees each Decide(commit) answer (coordDecideAnswer) and
// returns what restores it.
func SetDecideAnswer(h func(attempt int, err error) error) (restore func()) {
	return swapForTest(&coordDecideAnswer, h)
}

// SetCoordClock sets the coordinator's clock and decideTrust and returns what restores them.
func SetCoordClock(now func() time.Time, trust time.Duration) (restore func()) {
	oldNow, oldTrust := coordNow, decideTrust
	coordNow, decideTrust = now, trust
	return func() { coordNow, decideTrust = oldNow, oldTrust }
}

// NewTxnID returns the id n's next two-phase commit would get (tests only).
func NewTxnID(n *Node) [16]byte { return n.txnID() }

// SetTxnIDHook sets the hook that hears each transaction id made (tests only; set it before
// any transaction runs) and returns what restores it.
func SetTxnIDHook(h func(id [16]byte)) (restore func()) {
	return swapForTest(&txnIDHook, h)
}

// SetPrepareAnswer sets the hook that sees each participant's Prepare answer
// (coordPrepareAnswer) and returns what restores it.
func SetPrepareAnswer(h func(i int, err error) error) (restore func()) {
	return swapForTest(&coordPrepareAnswer, h)
}

// SetLockedRetries sets lockedRetries and lockedPauseMax and returns what restores them.
func SetLockedRetries(n int, pauseMax time.Duration) (restore func()) {
	oldN, oldMax := lockedRetries, lockedPauseMax
	lockedRetries, lockedPauseMax = n, pauseMax
	return func() { lockedRetries, lockedPauseMax = oldN, oldMax }
}

// SetMoveDoubtWait sets how long a move waits for the transactions in doubt at its source
// (moveDoubtWaitMax) and returns what restores it.
func SetMoveDoubtWait(max time.Duration) (restore func()) {
	return swapForTest(&moveDoubtWaitMax, max)
}

// SetMoveDoubtHook sets the hook that hears each freeze refused for a transaction in doubt
// (moveDoubtHook) and returns what restores it.
func SetMoveDoubtHook(h func(refused int)) (restore func()) {
	return swapForTest(&moveDoubtHook, h)
}

// SetMoveTimer sets the timer and clock of a move's waits for transactions in doubt
// (moveAfter, moveNow) and returns what restores them.
func SetMoveTimer(after func(d time.Duration) (<-chan time.Time, func() bool), now func() time.Time) (restore func()) {
	oldAfter, oldNow := moveAfter, moveNow
	moveAfter, moveNow = after, now
	return func() { moveAfter, moveNow = oldAfter, oldNow }
}

// SetMoveFlushHook sets the hook of the owner's steps of a move's flush (moveflush.go) and
// returns what restores it.
func SetMoveFlushHook(h func(step string)) (restore func()) {
	old := moveFlushHook.Swap(&h)
	return func() { moveFlushHook.Store(old) }
}

// DieDB makes the transaction node of the storage node at addr dead as a give-up would (its
// grants kept, as heal.go keeps them), without using the storage node afterwards: the next
// use finds it dead and replaces it (heal.go).
func DieDB(ctx context.Context, n *Node, addr string) error {
	n.mu.Lock()
	sc := n.dbs[addr]
	n.mu.Unlock()
	<-sc.ready
	sc.keep.Store(true)
	return sc.db.Close(ctx)
}

// Recording returns how many goroutines record an abort at its primary in the background
// (recordAbortLater).
func Recording(n *Node) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.recording
}

// RecordAbortLater records abort of transaction id (lease, count participants) at the
// storage node at addr in the background (recordAbortLater), over n's transaction node of
// it (dialled).
func RecordAbortLater(n *Node, id [16]byte, lease int64, count int, addr string) {
	n.recordAbortLater(abortRecord{id: id, lease: lease, count: count, primary: n.current(addr), primaryAddr: addr})
}

// SetMapWatchHook sets testhook.MapWatch for a test and returns what restores it. Set it
// before any Node of the test opens (its map watcher's goroutine reads it).
func SetMapWatchHook(h func(client any)) (restore func()) {
	return swapForTest(&testhook.MapWatch, h)
}
