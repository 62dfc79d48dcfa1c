package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/txnode"
	"github.com/weftdb/weft/txnode/txncoord"
)

// A storage node's transaction node (txnode.DB) reports through txnode.DB.Err that it cannot
// serve: while the storage node is unreachable (ErrUnavailable: it redials by itself and
// heals, docs/operations.md "The game server's side: a storage node outage"), or for good
// once its commit pipeline failed (an unknown outcome, a refusal). The Node replaces it on
// either, on the storage node's next use (a replaced DB's outage ends with the new one's
// dial):
//
//  1. found dead (Node.db checks Err on each use; a Table operation that failed asks it:
//     noteErr), it leaves the Node's map and becomes a pending heal (replace);
//  2. the next use of the storage node closes it (its etcd grants are not released: keep)
//     before it dials the new one, so that the storage node never has two live transaction
//     nodes of this node; a dial after a failed one waits until a backoff after that one
//     has passed (healBackoffMin doubling up to healBackoffMax; within the caller's
//     context: a caller whose context ends first fails without a dial, and without
//     growing the backoff, so callers of short deadlines heal too);
//  3. the new transaction node reopens, for every live Table handle (n.handles: also one
//     OpenTable replaced after a move, which still owns what it owned), the durable-read handle of
//     each partition on the storage node, and registers again the grants of the partitions
//     this node owned there: the grants are still this session's (cluster.Session.Acquire
//     returns a held ownership as it is), so the storage node takes them at the floor it
//     already has (a move's target too: its floor is just below the grant the switch kept;
//     a registration refused during a move keeps its grant: keepGrantKey). A partition whose grant was lost meanwhile (expired, taken, fenced) is
//     dropped as owned, as a lost grant always is (Table.Own refuses it after: reopen the
//     Node). Any other failure of step 3 closes the new transaction node and fails the
//     use; the next use starts again at step 2.
//
// Nothing acknowledged is lost in Durable mode: the dead transaction node's commits that
// were not acknowledged failed with txnode.ErrUnknownOutcome (or the pipeline's error), and
// an acknowledged one is on the storage node's WAL. In WriteBack mode the commits the dead
// node acknowledged but had not flushed are lost with it (as they are with a crash): its
// Close fails, and the Node logs an Error record naming the storage node (closedDead).
// Pins (Table.Pin) are not carried over.

// Backoff between dials of a storage node whose transaction node died.
const (
	healBackoffMin = 50 * time.Millisecond
	healBackoffMax = 2 * time.Second
)

// pendingHeal is a storage node's dead transaction node, not replaced yet.
type pendingHeal struct {
	old     *txnode.DB
	cause   error
	wait    time.Duration // the backoff after the last failed dial (0: none failed)
	next    time.Time     // no dial before (the last failed dial plus wait)
	closed  bool          // old was closed (by the first dial of its successor)
	lastErr error
}

// replace takes sc, whose transaction node died (derr), out of the Node's map, as a pending
// heal: the next use dials the successor (dial).
func (n *Node) replace(addr string, sc *storeConn, derr error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed || n.dbs[addr] != sc {
		return
	}
	delete(n.dbs, addr)
	sc.keep.Store(true)
	if n.heals[addr] == nil {
		n.heals[addr] = &pendingHeal{old: sc.db, cause: derr}
		n.sick.Store(int32(len(n.heals)))
	}
	n.log.Warn("node: the transaction node of a storage node died; replacing it", "addr", addr, "err", derr)
}

// noteErr, given the error of an operation on a partition of the storage node at addr,
// replaces its transaction node if that died. It returns err.
func (n *Node) noteErr(addr string, err error) error {
	if err == nil || errors.Is(err, txnode.ErrNotFound) {
		return err
	}
	n.mu.Lock()
	sc := n.dbs[addr]
	n.mu.Unlock()
	if sc == nil {
		return err
	}
	select {
	case <-sc.ready:
	default:
		return err // a dial in flight
	}
	if sc.db != nil {
		if derr := sc.db.Err(); derr != nil {
			n.replace(addr, sc, derr)
		}
	}
	return err
}

// current returns the live transaction node of the storage node at addr, nil while none is
// (not dialled, dialling, or being replaced).
func (n *Node) current(addr string) *txnode.DB {
	n.mu.Lock()
	sc := n.dbs[addr]
	n.mu.Unlock()
	if sc == nil {
		return nil
	}
	select {
	case <-sc.ready:
		return sc.db
	default:
		return nil
	}
}

// current reopens, on their storage nodes' live transaction nodes, the durable-read handles
// of t opened on one a heal replaced before t was registered (OpenTable, CreateTable: reown
// did not see t yet; once registered, every later heal does).
func (t *Table) current(ctx context.Context) error {
	for p := range t.parts {
		pt := &t.parts[p]
		for try := 0; ; try++ {
			r := pt.r.Load()
			if r.durable.DB() == t.n.current(r.addr) {
				break
			}
			db, err := t.n.db(ctx, r.addr)
			if err != nil {
				return err
			}
			if try == 2 {
				break // healed again meanwhile: its reown has the handle
			}
			d, err := txncoord.OpenDurable(ctx, db, base.PartitionTableName(t.m.Name, uint32(p)))
			if err != nil {
				return fmt.Errorf("node: open table %q partition %d on %s: %w", t.m.Name, p, r.addr, err)
			}
			pt.r.CompareAndSwap(r, &route{addr: r.addr, durable: d, rev: r.rev})
		}
	}
	return nil
}

// heal, at a Table operation's start, replaces partition p's transaction node if it died
// (only while some storage node's is: one atomic load otherwise).
func (t *Table) heal(ctx context.Context, p uint32) error {
	if t.n.sick.Load() == 0 {
		return nil
	}
	_, err := t.n.db(ctx, t.parts[p].addr())
	return err
}

// dial opens the transaction node of the storage node at addr into sc (n.dbs[addr] == sc,
// not ready yet), replacing a dead one first (see the top of this file).
func (n *Node) dial(ctx context.Context, addr string, sc *storeConn) (*txnode.DB, error) {
	n.mu.Lock()
	h := n.heals[addr]
	n.mu.Unlock()
	var err error
	if h != nil {
		// Only this dial touches h (it holds the address's slot in n.dbs).
		if !h.closed {
			h.closed = true
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			n.closedDead(addr, h, h.old.Close(cctx))
			cancel()
		}
		if d := time.Until(h.next); d > 0 {
			timer := time.NewTimer(d)
			select {
			case <-timer.C:
			case <-ctx.Done():
				timer.Stop()
				err = fmt.Errorf("node: storage node %s: waiting to redial (its transaction node died: %w): %w", addr, h.cause, ctx.Err())
			}
		}
		if err != nil {
			// No dial was tried: the backoff stays as it is (it runs from the last
			// failed dial, not from each caller's start).
			return n.dialed(addr, sc, h, err, false)
		}
	}
	if err == nil {
		sc.db, err = txncoord.Open(ctx, txnode.Options{
			StoreAddr: addr, OwnerID: n.cfg.Session.Owner, Secret: n.cfg.Secret,
			CacheBytes: n.cfg.CacheBytes, PinBytes: n.cfg.PinBytes, Durability: n.cfg.Durability, FlushInterval: n.cfg.FlushInterval,
			DialTimeout: n.cfg.DialTimeout, RequestTimeout: n.cfg.RequestTimeout, Logger: n.log,
		}, grants{s: n.sess, c: n.c, keep: &sc.keep})
		if err == nil && h != nil {
			if err = n.reown(ctx, addr, sc.db); err != nil {
				sc.keep.Store(true) // the grants stay for the next try
				cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				sc.db.Close(cctx)
				cancel()
				sc.db = nil
				err = fmt.Errorf("re-own its partitions: %w", err)
			}
		}
	}
	// A dial the caller's context cut short (it started with little of it left, after the
	// backoff's wait) is not a failed dial: the backoff does not grow, and the next call
	// dials at once. Counted, calls of 1 s deadlines could each wait out most of a backoff
	// above 1 s, then dial with too little time, for ever (TestStorageNodeBackShortDeadlinesHeal).
	return n.dialed(addr, sc, h, err, err != nil && ctx.Err() == nil)
}

// dialed ends dial: sc gets the new transaction node or err (tried: a dial failed, so the
// backoff grows).
func (n *Node) dialed(addr string, sc *storeConn, h *pendingHeal, err error, tried bool) (*txnode.DB, error) {
	var orphan *txnode.DB
	n.mu.Lock()
	if err != nil {
		sc.err = fmt.Errorf("node: storage node %s: %w", addr, err)
		if n.dbs[addr] == sc {
			delete(n.dbs, addr) // the next use dials again
		}
		if h != nil && tried {
			h.lastErr = err
			h.wait = min(max(2*h.wait, healBackoffMin), healBackoffMax)
			h.next = time.Now().Add(h.wait)
		}
	} else if n.closed {
		// Close ran meanwhile and took the map: this one is ours to close.
		orphan, sc.db, sc.err = sc.db, nil, ErrClosed
	} else if h != nil {
		delete(n.heals, addr)
		n.sick.Store(int32(len(n.heals)))
		n.log.Info("node: the transaction node of a storage node was replaced", "addr", addr)
	}
	if orphan == nil {
		close(sc.ready)
		n.mu.Unlock()
		return sc.db, sc.err
	}
	n.mu.Unlock()
	// Closed before ready: Close, which waits for sc.ready, returns only after it.
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	orphan.Close(cctx)
	cancel()
	close(sc.ready)
	return sc.db, sc.err
}

// closedDead reports the Close of a dead transaction node (err: what Close returned). In
// WriteBack mode a failed Close means commits it acknowledged and had not flushed are lost:
// an Error record says so (the game learns it from its log; nothing else reports it).
func (n *Node) closedDead(addr string, h *pendingHeal, err error) {
	switch {
	case err == nil || errors.Is(err, txnode.ErrClosed):
	case n.cfg.Durability == txnode.WriteBack:
		n.log.Error("node: the dead transaction node of a storage node did not flush: its acknowledged WriteBack commits not flushed yet are lost",
			"addr", addr, "cause", h.cause, "err", err)
	default:
		n.log.Warn("node: close of the dead transaction node of a storage node", "addr", addr, "err", err)
	}
}

// reown points every live Table handle's partitions on the storage node at addr to its new
// transaction node db: their durable-read handles, and the owned tables of the partitions
// this node owned (their grants registered again). A partition whose grant was lost is
// dropped as owned; any other failure is returned (the caller tries again later).
func (n *Node) reown(ctx context.Context, addr string, db *txnode.DB) error {
	n.mu.Lock()
	// Every live handle, not only the newest per name (n.tables): one OpenTable replaced
	// after a move still owns what it owned.
	tables := make([]*Table, 0, len(n.handles))
	for _, w := range n.handles {
		if t := w.Value(); t != nil {
			tables = append(tables, t)
		}
	}
	n.mu.Unlock()
	type fix struct {
		t      *Table
		p      uint32
		d      *txncoord.DurableTable
		o, was *txnode.Table
		r      *route
	}
	var fixes []fix
	for _, t := range tables {
		for p := range t.parts {
			pt := &t.parts[p]
			r := pt.r.Load()
			if r.addr != addr {
				continue
			}
			name := base.PartitionTableName(t.m.Name, uint32(p))
			d, err := txncoord.OpenDurable(ctx, db, name)
			if errors.Is(err, txnode.ErrTableNotFound) || errors.Is(err, storenode.ErrMoved) {
				// Dropped or moved away meanwhile: the old handle fails its reads (and
				// a moved partition is followed: follow.go).
				if pt.tb.Load() != nil && errors.Is(err, storenode.ErrMoved) {
					t.moving(ctx, uint32(p), err)
				}
				continue
			}
			if err != nil {
				return fmt.Errorf("table %q partition %d: %w", t.m.Name, p, err)
			}
			f := fix{t: t, p: uint32(p), d: d, was: pt.tb.Load(), r: r}
			if f.was != nil && !pt.lost.Load() {
				tb, err := db.Table(context.WithValue(ctx, keepGrantKey{}, true), name)
				if err == nil {
					err = txncoord.Serving(tb)
				}
				switch {
				case errors.Is(err, storenode.ErrMoved):
					t.moving(ctx, uint32(p), err) // owned again where it moved (follow.go)
				case isLost(err) || errors.Is(err, txnode.ErrTableNotFound):
					n.log.Warn("node: a partition's grant was lost while its storage node's transaction node was replaced",
						"table", t.m.Name, "part", p, "err", err)
					t.drop(uint32(p))
				case errors.As(err, new(*cluster.OwnedError)):
					n.log.Warn("node: a partition was taken while its storage node's transaction node was replaced",
						"table", t.m.Name, "part", p, "err", err)
					t.drop(uint32(p))
				case err != nil:
					return fmt.Errorf("table %q partition %d: %w", t.m.Name, p, err)
				default:
					f.o = tb
				}
			}
			fixes = append(fixes, f)
		}
	}
	for _, f := range fixes {
		pt := &f.t.parts[f.p]
		pt.r.CompareAndSwap(f.r, &route{addr: addr, durable: f.d, rev: f.r.rev}) // not if moved meanwhile
		if f.o != nil {
			o := n.publish(f.t, f.p, f.r.rev, f.o)
			if o == nil {
				continue // moved meanwhile, and published there by another handle
			}
			f.t.holdIfMoving(f.p, o)
			if pt.tb.CompareAndSwap(f.was, o) { // not if dropped meanwhile
				f.t.heldAfterStore(f.p, o)
			}
		}
	}
	return nil
}
