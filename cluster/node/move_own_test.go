package node_test

import (
	"context"
	"errors"
	"time"

	"sync"
	"sync/atomic"
	"testing"

	"github.com/weftdb/weft/cluster/etcdtest"
	"github.com/weftdb/weft/storenode"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/sgio"
)

// A move's switch keeps the owner's grant, so a second handle of the owner's node, opened
// after the switch (OpenTable reads the map itself: it routes the partition to the target),
// owns the partition there under the very grant the first handle holds and writes. The
// first handle, whose node's map watcher has not delivered the switch yet (held back here
// by the test hook; in production a watch delivery late), must not serve the partition's
// rows from its cache at the frozen source after that write was acknowledged: that is a
// stale read of an acknowledged write. Own waits for the node's watcher to reach the
// revision its routes reflect before it registers the grant (every later operation of the
// node's other handles follows the switch first). When the switch deleted the owner key
// the second handle's grant was a new one, taken only once the session heard the delete,
// which ended the first handle's grant: no stale read.
// Fails on 7f9ad60: the first handle read 1 after the second acknowledged 2.
func TestMoveSecondHandleOwnNoStaleRead(t *testing.T) {
	gate := newWatchGate()
	var ownerClient atomic.Pointer[cluster.Client]
	t.Cleanup(node.SetMapWatchHook(func(c any) {
		if c == any(ownerClient.Load()) {
			gate.wait()
		}
	}))
	waiting := make(chan struct{}, 1)
	t.Cleanup(node.SetRaceHook(func(where string) {
		if where == "own-watch" {
			select {
			case waiting <- struct{}{}:
			default:
			}
		}
	}))
	ctx := testCtx(t)
	tc := startCluster(t, 2)
	owner := tc.open(t, 0x1, "")
	ownerClient.Store(owner.Client())
	mover := tc.open(t, 0x2, "")
	t.Cleanup(gate.open) // before the Nodes close
	tbl := createTable(t, ctx, owner, "twoh", 64, 2, 1, tc.addrs)
	id := ownFirstRow(t, ctx, tbl)

	gate.hold.Store(true)
	mtbl := openTable(t, ctx, mover, "twoh")
	require.NoError(t, mtbl.Move(ctx, 0, tc.addrs[1]))

	tbl2 := openTable(t, ctx, owner, "twoh")
	require.Equal(t, tc.addrs[1], tbl2.NodeOf(id), "the fresh handle routes to the target")
	wrote := make(chan error, 1)
	go func() {
		if err := tbl2.Own(ctx, 0); err != nil {
			wrote <- err
			return
		}
		wrote <- tbl2.Put(ctx, id, balanceRow(2))
	}()
	select {
	case err := <-wrote:
		require.NoError(t, err, "the second handle owns and writes at the target")
	case <-waiting:
		// Own waits for the watcher: nothing written yet, the first handle's read is
		// current.
		row := make([]byte, 64)
		require.NoError(t, tbl.Get(ctx, id, row))
		require.EqualValues(t, 1, balanceOf(row))
		gate.open()
		require.NoError(t, <-wrote, "the second handle owns and writes at the target")
	}
	row := make([]byte, 64)
	require.NoError(t, tbl.Get(ctx, id, row), "the first handle's read")
	require.EqualValues(t, 2, balanceOf(row), "the first handle's read after the second handle's acknowledged write")
	gate.open()
}

// An Own refused during a move for another reason than the move (here the storage node
// could not verify the grant in etcd: its link to etcd is cut, storenode.ErrGrantUnverified)
// must not keep the grant it took: keepGrantKey skips txnode's release of a refused grant
// while a move is recorded, and nothing of the node uses that grant, so held it keeps every
// other node from the partition until the node's session ends (forever on a node that stays
// up and does not Own it again). Fails on 7f9ad60: the other node's Own was refused, the
// refused node named as the holder.
func TestMoveOwnRefusedOtherwiseReleasesUnused(t *testing.T) {
	ctx := testCtx(t)
	etcd := etcdtest.Start(t)
	direct := cluster.Config{Endpoints: etcd.ServerEndpoints(), Prefix: prefix, Logger: quiet}
	c, err := cluster.Connect(ctx, direct)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	// The storage nodes verify grants through the proxy, which the test cuts.
	vc, err := cluster.Connect(ctx, cluster.Config{Endpoints: etcd.Endpoints(), Prefix: prefix, Logger: quiet})
	require.NoError(t, err)
	t.Cleanup(func() { vc.Close() })
	v := cluster.NewGrantVerifier(vc, storenode.ErrFenced)
	tc := &testCluster{etcd: etcd, c: c}
	for range 2 {
		tc.addServer(t, storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone, GrantVerifier: v, GrantVerifyTimeout: 300 * time.Millisecond}, nil)
	}
	open := func(owner uint64) *node.Node {
		return tc.openConfig(t, node.Config{Etcd: direct, Session: cluster.SessionConfig{Owner: owner}})
	}
	mover := open(0x2)
	mtbl := createTable(t, ctx, mover, "own4", 64, 2, 1, tc.addrs)

	// The move holds before its freeze: the source takes grants, the record is there.
	copied, hold := make(chan struct{}), make(chan struct{})
	var once sync.Once
	unhold := func() { once.Do(func() { close(hold) }) }
	node.SetMoveStepHook(func(step string) {
		if step == node.MoveStepCopied {
			close(copied)
			<-hold
		}
	})
	t.Cleanup(func() { node.SetMoveStepHook(nil) })
	t.Cleanup(unhold)
	moved := make(chan error, 1)
	go func() { moved <- mtbl.Move(ctx, 0, tc.addrs[1]) }()
	select {
	case <-copied:
	case err := <-moved:
		t.Fatalf("the move ended before its freeze: %v", err)
	}

	a := open(0x1)
	atbl := openTable(t, ctx, a, "own4")
	etcd.Cut(true)
	require.ErrorIs(t, atbl.Own(ctx, 0), sgio.ErrBusy, "the source cannot verify the grant (storenode.ErrGrantUnverified)")
	etcd.Cut(false)
	_, held, err := c.Owner(ctx, "own4", 0)
	require.NoError(t, err)
	require.False(t, held, "the refused Own released the grant nothing uses")

	unhold()
	require.NoError(t, <-moved)
	b := open(0x3)
	btbl := openTable(t, ctx, b, "own4")
	// The storage nodes' etcd link comes back with grpc's reconnection backoff: a
	// verification meanwhile is ErrBusy (each try bounded by GrantVerifyTimeout).
	for try := 0; try < 100; try++ {
		if err = btbl.Own(ctx, 0); !errors.Is(err, sgio.ErrBusy) {
			break
		}
	}
	require.NoError(t, err, "another node owns the partition")
}

// A write refused at the switch (the target not live yet) whose context ends while the
// follow asks the target again must not give up the grant the switch kept: the caller's
// deadline is no sign that the move failed, and released, the partition changes hands at
// a switch after all (another node's OwnWait takes it at once). The follow forgets the
// owned table and releases the grant whenever its registration fails, the caller's context
// ending included (follow.go, movedOn: the ctx.Done cases and the pause).
func TestMoveFollowCallerDeadlineKeepsGrant(t *testing.T) {
	t.Skip("known defect: a follow cut short by the caller's context releases the grant the switch kept (movedOn forgets on any failure); rev3 report")
	ctx := testCtx(t)
	tc, _, mover, tbl, id := startOwnedFirst(t, ctx, "dl")
	before := tc.heldBy(t, ctx, "dl", 0)
	mtbl := openTable(t, ctx, mover, "dl")
	release, moved := switchHold(t, ctx, mtbl, tc.addrs[1])

	pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	require.Error(t, tbl.Put(pctx, id, balanceRow(2)), "refused at the frozen source, the target not live")
	cancel()
	h, held := tc.holder(t, ctx, "dl", 0)
	require.True(t, held, "the caller's deadline gave up the grant the switch kept")
	require.Equal(t, before, h)
	release()
	require.NoError(t, <-moved)
}
