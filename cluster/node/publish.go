package node

import (
	"sync"

	"github.com/weftdb/weft/txnode"
	"github.com/weftdb/weft/txnode/txncoord"
)

// Which owned table serves a partition on this Node (docs/cluster.md, "A validation counts
// only where the partition is still served"). Every handle of a table stores the owned table
// of a partition (part.tb) only through publish, which supersedes the one published before
// when it is another table (txncoord.Supersede: not a handle of its state), before the new
// one can serve a write. Rules:
//   - a transaction's read of a superseded table never validates, so no handle (one that
//     has not followed a move yet, one the game keeps beside a newer one) commits from a
//     cache nothing writes any more;
//   - a table of a transaction node that is gone (closed by a heal, failed) is published to
//     its handle but supersedes nothing: a late store of it must not mark its successor;
//   - a forgotten or released table is superseded by what is published after it; one
//     published again (the same state) stays as it is.

// published is the owned table this Node last published for each partition (publishKey).
type published struct {
	mu sync.Mutex
	m  map[publishKey]*txnode.Table
}

type publishKey struct {
	table string
	part  uint32
}

// publish records tb (non-nil) as the owned table serving partition p of table name, the
// one published before superseded unless tb is a handle of its state or tb's transaction
// node is gone. Call it before tb is stored where transactions route.
func (n *Node) publish(name string, p uint32, tb *txnode.Table) {
	if txncoord.TableDB(tb).Err() != nil {
		return // a dead transaction node's table: its successor's, if any, stays
	}
	n.pub.mu.Lock()
	defer n.pub.mu.Unlock()
	k := publishKey{name, p}
	if old := n.pub.m[k]; old != nil {
		txncoord.Supersede(old, tb)
	}
	if n.pub.m == nil {
		n.pub.m = make(map[publishKey]*txnode.Table)
	}
	n.pub.m[k] = tb
}

// unpublish supersedes was, partition p's table on a storage node that serves the partition
// no more (a move's source, whose follow failed), without a successor.
func (n *Node) unpublish(name string, p uint32, was *txnode.Table) {
	n.pub.mu.Lock()
	defer n.pub.mu.Unlock()
	txncoord.Supersede(was, nil)
	if k := (publishKey{name, p}); txncoord.Same(n.pub.m[k], was) {
		delete(n.pub.m, k)
	}
}
