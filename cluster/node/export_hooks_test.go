package node

import (
	"context"

	"github.com/weftdb/weft/cluster/internal/testhook"
)

// SetOwnerWatchHook sets testhook.OwnerWatch for a test and returns what restores it. Set it
// before any Node of the test opens (its session's watch goroutine reads it).
func SetOwnerWatchHook(h func(owner uint64)) (restore func()) {
	return swapForTest(&testhook.OwnerWatch, h)
}

// SyncMap brings n's map watcher up to etcd's revision (a linearizable read).
func SyncMap(ctx context.Context, n *Node) error {
	_, err := n.w.Sync(ctx)
	return err
}

// WaitFinishing waits, without cancelling them, for the two-phase commits n finishes in the
// background (finishLater, the abort records) to end.
func WaitFinishing(n *Node) { n.finishing.Wait() }
