package node

import (
	"sync"

	"github.com/weftdb/weft/txnode"
	"github.com/weftdb/weft/txnode/txncoord"
)

// Which owned table serves a partition on this Node (docs/cluster.md, "A validation counts
// only where the partition is still served"). Every handle of a table stores the owned table
// of a partition (part.tb) only through publish, which keeps the latest one and supersedes
// the others (txncoord.Supersede: a transaction that read a superseded table never
// validates), before the latest can serve a write. Rules:
//   - latest: obtained for a later placement of the partition (the map revision of its
//     route), or on the same placement a later table state (txncoord.Serial: forgotten and
//     opened again, a heal's new transaction node); a handle of the published state
//     (txncoord.Same) is the same table;
//   - a publish that is not the latest supersedes its own table, never the latest: a late
//     publish (an Own, a follow, a heal that raced another handle's) cannot mark the table
//     that serves the partition, which no call could then clear;
//   - a table of a transaction node that is gone (closed by a heal, failed) supersedes
//     nothing and is not recorded: its calls fail and heal;
//   - bounded: one entry per partition of each table this Node owns or owned, forgotten
//     once a handle finds the table dropped (unpublishDropped).

// published is the latest owned table this Node published for each partition.
type published struct {
	mu sync.Mutex
	m  map[publishKey]publishEntry
}

// publishKey names a partition of one table: a table dropped and created again under its
// name is another (its creation revision).
type publishKey struct {
	table   string
	created int64
	part    uint32
}

type publishEntry struct {
	tb     *txnode.Table
	rev    int64  // the map revision of the route it was obtained for
	serial uint64 // txncoord.Serial(tb)
}

// publish offers tb, obtained for partition p of t's table at the placement of map
// revision rev, as the owned table serving it, and returns the table the caller stores:
// tb when it is the latest; else the latest, when it is on tb's transaction node (a handle
// of the state that serves the partition there); else nil (the partition is published at a
// later placement: the caller stores nothing, its next follow takes it up). Call it before
// the table is stored where transactions route.
func (n *Node) publish(t *Table, p uint32, rev int64, tb *txnode.Table) *txnode.Table {
	db := txncoord.TableDB(tb)
	if db.Err() != nil {
		return tb // a dead transaction node's table: its successor's, if any, stays
	}
	n.pub.mu.Lock()
	defer n.pub.mu.Unlock()
	k := publishKey{t.m.Name, t.m.Created, p}
	cur, ok := n.pub.m[k]
	switch {
	case ok && txncoord.Same(cur.tb, tb):
		if rev > cur.rev {
			cur.rev = rev
			n.pub.m[k] = cur
		}
		return tb
	case !ok || rev > cur.rev || rev == cur.rev && txncoord.Serial(tb) > cur.serial || txncoord.TableDB(cur.tb).Err() != nil:
		if ok {
			txncoord.Supersede(cur.tb, tb)
		}
		if n.pub.m == nil {
			n.pub.m = make(map[publishKey]publishEntry)
		}
		n.pub.m[k] = publishEntry{tb: tb, rev: rev, serial: txncoord.Serial(tb)}
		return tb
	}
	txncoord.Supersede(tb, cur.tb) // not the latest: it serves the partition no more
	if txncoord.TableDB(cur.tb) == db {
		return cur.tb
	}
	return nil
}

// unpublishDropped forgets what was published for t's table, which a handle found dropped:
// the Node keeps nothing of a dropped table, however many come and go (one created again
// under its name is another key).
func (n *Node) unpublishDropped(t *Table) {
	n.pub.mu.Lock()
	defer n.pub.mu.Unlock()
	for k, e := range n.pub.m {
		if k.table == t.m.Name && k.created == t.m.Created {
			txncoord.Supersede(e.tb, nil)
			delete(n.pub.m, k)
		}
	}
}

// unpublish supersedes was, partition p's table on a storage node that serves the partition
// no more (a move's source, whose follow failed), without a successor.
func (n *Node) unpublish(t *Table, p uint32, was *txnode.Table) {
	n.pub.mu.Lock()
	defer n.pub.mu.Unlock()
	txncoord.Supersede(was, nil)
	if k := (publishKey{t.m.Name, t.m.Created, p}); txncoord.Same(n.pub.m[k].tb, was) {
		delete(n.pub.m, k)
	}
}
