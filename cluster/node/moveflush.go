package node

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/txnode"
	"github.com/weftdb/weft/txnode/txncoord"
)

// The owner's side of a move's flush request (cluster/moveflush.go; docs/cluster.md,
// "Writes during a move"). A mover asks a WriteBack owner before it freezes the source (a
// Durable one is not asked: every write it acknowledged is durable); then:
//   - the partition's table holds its writes (txncoord.HoldWrites: refused, never
//     acknowledged; the caller gets a *NotOwnerError and retries) and its DB flushes every
//     commit admitted before; then the request is answered;
//   - a table of the partition set while a request stands (Own, a heal's replacement, the
//     follow to the target) is held before it is stored, and flushed and answered too;
//   - the request ended (the move done or rolled back): the map is synced first, so a
//     switched partition is routed to its target; only then is the partition's table written
//     again. A table of the source left behind by the switch stays held: never written.

// moveFlushKey names a partition's flush request in Node.flushReqs.
type moveFlushKey = releasedKey

// moveFlushRetryMax bounds the pause between tries to sync the map after a request ended.
const moveFlushRetryMax = 2 * time.Second

// onMoveFlush is the session's MoveFlush: on the owner-key watch's goroutine, under the
// session's lock, so it only records the request and starts the work on a goroutine.
func (n *Node) onMoveFlush(o *cluster.Ownership, epoch int64) {
	if n.cfg.Durability != txnode.WriteBack {
		return // not asked (the owner values say so), nothing to flush
	}
	k := moveFlushKey{o.Table(), o.Part()}
	if epoch == 0 {
		n.flushReqs.Delete(k)
		n.moveFlushLater(func() { n.resumeAfterMove(k) })
		return
	}
	n.flushReqs.Store(k, epoch)
	if _, tb := n.moveFlushTable(k); tb != nil {
		txncoord.HoldWrites(tb) // at once: no write of the partition is acknowledged from here
	}
	n.moveFlushLater(func() { n.flushForMove(k, epoch) })
}

// moveFlushLater runs fn on a goroutine Close waits for (finishing), unless closing.
func (n *Node) moveFlushLater(fn func()) {
	n.flushMu.Lock()
	defer n.flushMu.Unlock()
	if n.flushClosed {
		return
	}
	n.finishing.Add(1)
	go func() {
		defer n.finishing.Done()
		fn()
	}()
}

// moveFlushTable returns the Table of k's table and the partition's txnode table (nil when
// it has none: not owned through a handle, or an Own still in progress, which holds it
// itself: holdIfMoving).
func (n *Node) moveFlushTable(k moveFlushKey) (*Table, *txnode.Table) {
	n.mu.Lock()
	t := n.tables[k.table]
	n.mu.Unlock()
	if t == nil || int(k.part) >= len(t.parts) {
		return nil, nil
	}
	return t, t.parts[k.part].tb.Load()
}

// flushForMove flushes partition k's writes for the request of mover epoch epoch and
// answers it, unless the request changed meanwhile. No table of the partition: an Own in
// progress answers once it has one (holdIfMoving); none comes when the grant was lost, and
// the mover then waits in vain and rolls back.
func (n *Node) flushForMove(k moveFlushKey, epoch int64) {
	t, tb := n.moveFlushTable(k)
	if tb == nil {
		return
	}
	ctx, cancel := context.WithTimeout(n.bg, n.moveFlushTimeout())
	defer cancel()
	if err := txncoord.FlushHeld(ctx, tb); err != nil {
		n.log.Warn("node: flush for a move", "table", k.table, "part", k.part, "err", err)
		return
	}
	if e, ok := n.flushReqs.Load(k); !ok || e.(int64) != epoch {
		return // ended or asked again meanwhile: that one answers
	}
	if t.parts[k.part].tb.Load() != tb {
		return // another table set meanwhile: its setter's flush answers (holdIfMoving)
	}
	o := n.sess.Held(k.table, k.part)
	if o == nil {
		return
	}
	if err := o.AckFlush(ctx, epoch); err != nil {
		n.log.Warn("node: answer a move's flush request", "table", k.table, "part", k.part, "err", err)
	}
}

// moveFlushTimeout bounds one flush and its answer.
func (n *Node) moveFlushTimeout() time.Duration {
	if n.cfg.RequestTimeout > 0 {
		return 2 * n.cfg.RequestTimeout
	}
	return 10 * time.Second
}

// holdIfMoving is called by whoever sets partition p's table tb, before it stores it, and
// again after (heldAfterStore): while a flush request stands, tb is held (WriteBack) and a
// flush and answer started. (Before: no write reaches tb unheld. After: a request the
// watch recorded between the first look and the store found no table to flush.)
func (t *Table) holdIfMoving(p uint32, tb *txnode.Table) {
	n := t.n
	k := moveFlushKey{t.m.Name, p}
	e, ok := n.flushReqs.Load(k)
	if !ok {
		return
	}
	txncoord.HoldWrites(tb)
	epoch := e.(int64)
	n.moveFlushLater(func() { n.flushForMove(k, epoch) })
}

// heldAfterStore is holdIfMoving after the store.
func (t *Table) heldAfterStore(p uint32, tb *txnode.Table) {
	if !txncoord.WritesHeld(tb) {
		t.holdIfMoving(p, tb)
	}
}

// resumeAfterMove writes partition k again once its request ended: after the map is synced
// (a switched partition is routed to its target by then), and only if no new request came.
func (n *Node) resumeAfterMove(k moveFlushKey) {
	wait := 50 * time.Millisecond
	for n.bg.Err() == nil {
		t, _ := n.moveFlushTable(k)
		if t == nil {
			return
		}
		err := t.resync(n.bg)
		if err == nil || errors.Is(err, cluster.ErrTableNotFound) {
			break
		}
		n.log.Warn("node: sync the map after a move", "table", k.table, "part", k.part, "err", err)
		select {
		case <-time.After(wait/2 + rand.N(wait/2+1)): // a retry's pause
		case <-n.bg.Done():
			return
		}
		wait = min(2*wait, moveFlushRetryMax)
	}
	if _, ok := n.flushReqs.Load(k); ok {
		return // asked again: that request's end resumes it
	}
	if _, tb := n.moveFlushTable(k); tb != nil && txncoord.WritesHeld(tb) {
		txncoord.ResumeWrites(tb)
	}
}

// heldWrite maps a write of owned partition p refused because its writes are held for a
// move (txnode.ErrMoved from tb, held) to the partition's *NotOwnerError; ok false otherwise.
func (t *Table) heldWrite(p uint32, tb *txnode.Table, err error) (error, bool) {
	if tb == nil || !errors.Is(err, storenode.ErrMoved) || !txncoord.WritesHeld(tb) {
		return err, false
	}
	ne := &NotOwnerError{Table: t.m.Name, Part: p, Held: true, Holder: t.n.sess.Holder()}
	return fmt.Errorf("%w (being moved: its writes are held until the move ends; retry: %w)", ne, err), true
}
