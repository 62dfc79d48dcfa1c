package node

import (
	"context"

	"github.com/weftdb/weft/cluster/internal/testhook"
)

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
