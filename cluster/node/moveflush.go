package node

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/weftdb/weft/base"
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
//     again. A table of the source left behind by the switch stays held: never written;
//   - a flush that finds its request ended (or fails) handles the end again (resumeIfEnded):
//     its FlushHeld held the tables anew, maybe after the end's resume.

// moveFlushKey names a partition's flush request in Node.flushReqs.
type moveFlushKey struct {
	table string
	part  uint32
}

// moveFlushHook, set by tests, hears the owner's steps: "flushing" (a flush for a request
// begins, its tables found), "answered" (a request answered), "resumed" (a request's end
// handled: the partition is written again, or stays held).
var moveFlushHook atomic.Pointer[func(step string)]

func moveFlushStep(step string) {
	if h := moveFlushHook.Load(); h != nil {
		(*h)(step)
	}
}

// moveFlushRetryMax bounds the pause between tries to sync the map after a request ended.
const moveFlushRetryMax = 2 * time.Second

// onMoveFlush is the session's MoveFlush: on the owner-key watch's goroutine, under the
// session's lock, so it only records the request and starts the work on a goroutine.
func (n *Node) onMoveFlush(o *cluster.Ownership, epoch int64) {
	if n.cfg.Durability != txnode.WriteBack {
		return // not asked (the owner values say so), nothing to flush
	}
	k := moveFlushKey{o.Table(), o.Part()}
	n.flushMu.Lock()
	defer n.flushMu.Unlock()
	if epoch == 0 {
		n.flushReqs.Delete(k)
		n.moveFlushLaterLocked(func() { n.resumeAfterMove(k) })
		return
	}
	n.flushReqs.Store(k, epoch)
	for _, pt := range n.moveFlushTables(k) {
		txncoord.HoldWrites(pt.tb) // at once: no write of the partition is acknowledged from here
	}
	n.moveFlushLaterLocked(func() { n.flushForMove(k, epoch) })
}

// moveFlushLaterLocked runs fn on a goroutine Close waits for (finishing), unless closing.
// Caller holds flushMu, which also orders a request's hold against an ended one's resume.
func (n *Node) moveFlushLaterLocked(fn func()) {
	if n.flushClosed {
		return
	}
	n.finishing.Add(1)
	go func() {
		defer n.finishing.Done()
		fn()
	}()
}

// heldPart is one live handle's table of a partition (t nil: the table as the transaction
// node of the partition's storage node has it open, whatever handle owns it).
type heldPart struct {
	t  *Table
	tb *txnode.Table
}

// moveFlushTables returns the partition's txnode table in every live handle of k's table
// (a handle opened after a move is another Table; an older one may still own partitions),
// and as the transaction node of the storage node the map places it on has it open: a
// handle the game let go (collected: the Node's list of handles is weak) leaves the table
// open there, its acknowledged writes in the cache. An Own still in progress is not among
// them: it holds its table itself (holdIfMoving).
func (n *Node) moveFlushTables(k moveFlushKey) []heldPart {
	var out []heldPart
	for _, t := range n.liveHandles(k.table) {
		if int(k.part) < len(t.parts) {
			if tb := t.parts[k.part].tb.Load(); tb != nil {
				out = append(out, heldPart{t, tb})
			}
		}
	}
	if db, name := n.partitionDB(k); db != nil {
		if tb := txncoord.Opened(db, name); tb != nil {
			out = append(out, heldPart{nil, tb})
		}
	}
	return out
}

// partitionDB returns the transaction node of the storage node the Node's map places
// partition k on, and the partition's table name there (nil when none is dialled).
func (n *Node) partitionDB(k moveFlushKey) (*txnode.DB, string) {
	tm, err := n.w.Map().Table(k.table)
	if err != nil || int(k.part) >= len(tm.Nodes) {
		return nil, ""
	}
	return n.current(tm.Nodes[k.part]), base.PartitionTableName(k.table, k.part)
}

// liveHandles returns the live Table handles of the named table.
func (n *Node) liveHandles(name string) []*Table {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []*Table
	for _, w := range n.handles {
		if t := w.Value(); t != nil && t.m.Name == name {
			out = append(out, t)
		}
	}
	return out
}

// flushForMove flushes partition k's writes for the request of mover epoch epoch and
// answers it, unless the request changed meanwhile. No table of the partition: an Own in
// progress answers once it has one (holdIfMoving); none comes when the grant was lost, and
// the mover then waits in vain and rolls back.
func (n *Node) flushForMove(k moveFlushKey, epoch int64) {
	held := n.moveFlushTables(k)
	if len(held) == 0 {
		return
	}
	moveFlushStep("flushing")
	ctx, cancel := context.WithTimeout(n.bg, n.moveFlushTimeout())
	defer cancel()
	for _, h := range held {
		if err := txncoord.FlushHeld(ctx, h.tb); err != nil {
			n.log.Warn("node: flush for a move", "table", k.table, "part", k.part, "err", err)
			n.resumeIfEnded(k)
			return
		}
	}
	if e, ok := n.flushReqs.Load(k); !ok || e.(int64) != epoch {
		n.resumeIfEnded(k)
		return // ended or asked again meanwhile: that one answers
	}
	for _, h := range held {
		if h.t != nil && h.t.parts[k.part].tb.Load() != h.tb {
			return // another table set meanwhile: its setter's flush answers (holdIfMoving)
		}
	}
	o := n.sess.Held(k.table, k.part)
	if o == nil {
		return
	}
	if err := o.AckFlush(ctx, epoch); err != nil {
		n.log.Warn("node: answer a move's flush request", "table", k.table, "part", k.part, "err", err)
		return
	}
	moveFlushStep("answered")
}

// resumeIfEnded runs the end of partition k's request again when none stands any more: a
// flush's FlushHeld holds its tables again, and the request may have ended (its resume
// done) before, so nothing else would write them again.
func (n *Node) resumeIfEnded(k moveFlushKey) {
	if _, ok := n.flushReqs.Load(k); !ok {
		n.resumeAfterMove(k)
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
	n.flushMu.Lock()
	defer n.flushMu.Unlock()
	e, ok := n.flushReqs.Load(k)
	if !ok {
		return
	}
	txncoord.HoldWrites(tb)
	epoch := e.(int64)
	n.moveFlushLaterLocked(func() { n.flushForMove(k, epoch) })
}

// heldAfterStore is holdIfMoving after the store.
func (t *Table) heldAfterStore(p uint32, tb *txnode.Table) {
	if !txncoord.WritesHeld(tb) {
		t.holdIfMoving(p, tb)
	}
}

// resumeAfterMove writes partition k again once its request ended: after each handle's
// map is synced (a switched partition is routed to its target by then), and only if no new
// request came.
func (n *Node) resumeAfterMove(k moveFlushKey) {
	for _, t := range n.liveHandles(k.table) {
		wait := 50 * time.Millisecond
		for {
			err := t.resyncPart(n.bg, k.part)
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
	}
	n.flushMu.Lock()
	defer n.flushMu.Unlock()
	defer moveFlushStep("resumed")
	if _, ok := n.flushReqs.Load(k); ok {
		return // asked again: that request's end resumes it
	}
	n.flushEnds.Add(1) // before any resume: a write refused as held until now is told so (heldWrite)
	for _, h := range n.moveFlushTables(k) {
		// (The transaction node's table, h.t nil, is of the storage node the synced map
		// places the partition on: its source after a rollback, its target after a switch.)
		if txncoord.WritesHeld(h.tb) {
			txncoord.ResumeWrites(h.tb)
		}
	}
}

// heldSince is what a write of an owned table takes before it writes, for heldWrite.
func (n *Node) heldSince() uint64 { return n.flushEnds.Load() }

// heldWrite maps a write of owned partition p refused because its writes are held for a
// move to the partition's *NotOwnerError; ok false otherwise. Rules:
//   - tb is the table written (not the partition's table now: a follow may have replaced
//     it), since the write's heldSince;
//   - refused as held: txnode.ErrMoved from tb, and tb still held, or a hold ended since
//     the write began (the request's end resumes tb at any moment: the refusal was then of
//     a hold that is over). An ErrMoved of another cause meeting a hold's end is told as
//     held too: a *NotOwnerError all the same (never acknowledged: retried).
func (t *Table) heldWrite(p uint32, tb *txnode.Table, since uint64, err error) (error, bool) {
	if tb == nil || !errors.Is(err, storenode.ErrMoved) {
		return err, false
	}
	if h := raceHook; h != nil {
		h("write-moved")
	}
	if !txncoord.WritesHeld(tb) && t.n.heldSince() == since {
		return err, false
	}
	ne := &NotOwnerError{Table: t.m.Name, Part: p, Held: true, Holder: t.n.sess.Holder()}
	return fmt.Errorf("%w (being moved: its writes are held until the move ends; retry: %w)", ne, err), true
}
