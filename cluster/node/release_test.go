package node_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/etcdtest"
	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/txnode"
)

// Table.Release gives up one partition without closing the Node: another node's Own of it
// succeeds at once (Own, not OwnWait, under an hour-long TTL: no lease is waited out), and
// reads the releasing node's last acknowledged write (in WriteBack mode, with a flush period
// that never comes, only Release's flush writes it); the released partition's writes from
// the releasing node fail with a *NotOwnerError naming the new holder, its other partition
// keeps working, and it cannot own the released one again while b holds it (a *NotOwnerError
// naming b; once b releases it, a owns it again: TestOwnAgainAfterRelease). Releasing it again,
// or a partition not owned, is a no-op; one the table does not have, cluster.ErrInvalid.
func TestReleaseHandsOverAtOnce(t *testing.T) {
	eachDurability(t, func(t *testing.T, mode txnode.Durability) {
		ctx := testCtx(t)
		tc := startCluster(t, 1)
		a := tc.openConfig(t, node.Config{Session: cluster.SessionConfig{Owner: 0xa, Addr: "game-a:7000", TTL: time.Hour},
			Durability: mode, FlushInterval: 1 << 40})
		b := tc.openConfig(t, node.Config{Session: cluster.SessionConfig{Owner: 0xb, Addr: "game-b:7000", TTL: time.Hour}})
		ta := createTable(t, ctx, a, "rel", 64, 2, 1, tc.addrs)
		tb := openTable(t, ctx, b, "rel")
		x, y := ownTwoRows(t, ctx, ta)
		require.NoError(t, ta.Put(ctx, x, balanceRow(7)))
		require.NoError(t, ta.Put(ctx, y, balanceRow(8)))
		// b cannot take partition 0 while a holds it.
		require.ErrorIs(t, tb.Own(ctx, 0), node.ErrNotOwner)

		require.NoError(t, ta.Release(ctx, 0))
		require.Equal(t, []uint32{1}, ta.Owned())
		require.Equal(t, node.OwnReleased, ta.OwnState(0))
		require.Equal(t, node.OwnHeld, ta.OwnState(1))
		require.NoError(t, tb.Own(ctx, 0), "b owns the released partition at once")
		dst := make([]byte, 64)
		requireBalance(t, ctx, tb, x, dst, 7, "a's last write before Release, read by the new owner")
		require.NoError(t, tb.Put(ctx, x, balanceRow(9)))

		// a: the released partition's writes refused, naming b; its reads durable.
		err := ta.Put(ctx, x, balanceRow(10))
		var ne *node.NotOwnerError
		require.ErrorAs(t, err, &ne)
		require.True(t, ne.Held)
		require.Equal(t, "game-b:7000", ne.Holder.Addr)
		require.ErrorIs(t, ta.Update(ctx, x, func([]byte) error { return nil }), node.ErrNotOwner)
		require.ErrorIs(t, ta.Delete(ctx, x), node.ErrNotOwner)
		require.ErrorIs(t, a.Update(ctx, func(tx *node.Tx) error { return tx.Put(ta, x, balanceRow(11)) }), node.ErrNotOwner)
		requireBalance(t, ctx, ta, x, dst, 9, "a reads b's durable write")

		// a's other partition keeps working; its inserts go there only.
		require.NoError(t, ta.Put(ctx, y, balanceRow(12)))
		for range 3 {
			require.EqualValues(t, 1, ta.Partition(insertRow(t, ctx, ta, balanceRow(1))))
		}
		requireBalance(t, ctx, ta, y, dst, 12)

		// b holds it: a's Own is refused, naming b; releasing again, or what a does not
		// own, is a no-op; a partition the table does not have is refused.
		err = ta.Own(ctx, 0)
		require.ErrorAs(t, err, &ne)
		require.Equal(t, "game-b:7000", ne.Holder.Addr)
		require.NoError(t, ta.Release(ctx, 0))
		require.NoError(t, tb.Release(ctx, 1), "b does not own partition 1: a no-op")
		require.Equal(t, []uint32{1}, ta.Owned())
		require.ErrorIs(t, ta.Release(ctx, 1, 2), cluster.ErrInvalid)
		require.Equal(t, []uint32{1}, ta.Owned(), "nothing released by a refused call")

		// Releasing the last one: a owns nothing, b takes it at once too.
		require.NoError(t, ta.Release(ctx, 1, 1))
		require.Empty(t, ta.Owned())
		_, err = ta.Insert(ctx, balanceRow(1))
		require.ErrorIs(t, err, node.ErrNotOwner)
		require.NoError(t, tb.Own(ctx, 1))
		requireBalance(t, ctx, tb, y, dst, 12)
	})
}

// OwnState tells a partition mid-move from one lost for good, neither of which Owned lists.
// Mid-move: the owner's write to the frozen source fails (a *NotOwnerError to retry), the
// partition is OwnMoving, and once the move is done the owner writes on (OwnHeld again).
// Lost: its owner key deleted and another node owning it, the owner's write fails naming
// that node, and the partition is OwnLost.
func TestOwnStateMovingAndLost(t *testing.T) {
	ctx := testCtx(t)
	tc := startCluster(t, 2)
	a := tc.open(t, 0xa, "game-a:7000")
	b := tc.open(t, 0xb, "game-b:7000")
	ta := createTable(t, ctx, a, "st", 64, 2, 1, tc.addrs)
	require.Equal(t, tc.addrs[0], ta.Map().Nodes[0])
	require.Equal(t, node.OwnNone, ta.OwnState(0))
	require.Equal(t, node.OwnNone, ta.OwnState(7), "no such partition")
	x, y := ownTwoRows(t, ctx, ta)
	require.Equal(t, node.OwnHeld, ta.OwnState(0))

	// Mid-move: partition 0 frozen at its source.
	mt := openTable(t, ctx, b, "st")
	release, moved := freezeHold(t, ctx, mt, 0, tc.addrs[1])
	err := ta.Put(ctx, x, balanceRow(2))
	require.ErrorIs(t, err, node.ErrNotOwner, "a write to the frozen source")
	require.Equal(t, node.OwnMoving, ta.OwnState(0))
	require.Equal(t, []uint32{1}, ta.Owned())
	require.Equal(t, node.OwnHeld, ta.OwnState(1))
	close(release)
	require.NoError(t, <-moved)
	for try := 0; ; try++ {
		if err = ta.Put(ctx, x, balanceRow(3)); err == nil || try == 10 {
			break
		}
	}
	require.NoError(t, err, "the owner writes on once the move is done")
	require.Equal(t, node.OwnHeld, ta.OwnState(0))
	require.Equal(t, tc.addrs[1], ta.NodeOf(x))

	// Lost: partition 1's owner key deleted, b owning it.
	tc.deleteOwnerKey(t, ctx, "st", 1)
	tb := openTable(t, ctx, b, "st")
	require.NoError(t, tb.Own(ctx, 1))
	err = ta.Put(ctx, y, balanceRow(4))
	var ne *node.NotOwnerError
	require.True(t, errors.As(err, &ne), "a's write after its grant was lost: %v", err)
	require.Equal(t, "game-b:7000", ne.Holder.Addr)
	require.Equal(t, node.OwnLost, ta.OwnState(1))
	require.Equal(t, []uint32{0}, ta.Owned())
	require.Equal(t, node.OwnHeld, ta.OwnState(0), "the moved partition is not lost")
	require.NoError(t, ta.Put(ctx, x, balanceRow(5)))
}

// A Release whose ctx has already ended changes nothing: it returns ctx's error and the
// partition stays owned (Release's doc: "When the wait fails (ctx ends ...) the partition
// stays owned"). Before the fix (a hostile review): releaseOne's select between the owning token
// and ctx.Done picked either at random and DB.Flush's fast path ignored ctx, so the partition
// was released here and only the etcd delete failed: owned by nobody, its owner key kept for
// the lease's TTL (an hour here), and this Node could not own it again.
func TestReleaseWithEndedContextLeavesPartitionOwned(t *testing.T) {
	ctx := testCtx(t)
	tc := startCluster(t, 1)
	a := tc.openConfig(t, node.Config{Session: cluster.SessionConfig{Owner: 0xa, Addr: "game-a:7000", TTL: time.Hour}})
	const n = 8
	ta := createTable(t, ctx, a, "relctx", 64, n, 1, tc.addrs)
	all := make([]uint32, n)
	for p := range all {
		all[p] = uint32(p)
	}
	require.NoError(t, ta.Own(ctx, all...))
	ended, cancel := context.WithCancel(ctx)
	cancel()
	for _, p := range all {
		err := ta.Release(ended, p)
		require.ErrorIs(t, err, context.Canceled, "partition %d", p)
		require.Equal(t, node.OwnHeld, ta.OwnState(p), "partition %d: a Release with its ctx ended released it (%v)", p, err)
	}
}

// Once released, this Node owns the partition again through any of its handles (its
// transaction node forgot the table at the release: txnode.Table.Forget): a handle opened
// after the release (the map changed) owns it, and reads the rows another node wrote
// meanwhile, not its own cached ones. Before (a hostile review) the second handle's Own was
// refused as a lost grant (cluster.ErrLost); then, for good, with ErrReleased (gone: the
// transaction node kept the table's state for its life).
func TestReleasedPartitionIsNotOwnedAgainThroughAnotherHandle(t *testing.T) {
	ctx := testCtx(t)
	tc := startCluster(t, 2)
	a := tc.openConfig(t, node.Config{Session: cluster.SessionConfig{Owner: 0xa, Addr: "game-a:7000", TTL: time.Hour}})
	b := tc.openConfig(t, node.Config{Session: cluster.SessionConfig{Owner: 0xb, Addr: "game-b:7000", TTL: time.Hour}})
	ta := createTable(t, ctx, a, "reown", 64, 2, 1, tc.addrs)
	require.NoError(t, ta.Own(ctx, 0))
	var x uint64
	for {
		id := insertRow(t, ctx, ta, balanceRow(1))
		if ta.Partition(id) == 0 {
			x = id
			break
		}
	}
	require.NoError(t, ta.Put(ctx, x, balanceRow(7)))
	dst := make([]byte, 64)
	require.NoError(t, ta.Get(ctx, x, dst)) // cached at a
	require.NoError(t, ta.Release(ctx, 0))

	tb := openTable(t, ctx, b, "reown")
	require.NoError(t, tb.Own(ctx, 0))
	require.NoError(t, tb.Put(ctx, x, balanceRow(9)))
	require.NoError(t, tb.Release(ctx, 0))

	// Partition 1 (owned by nobody) moves: a's next OpenTable is a second handle.
	require.NoError(t, openTable(t, ctx, b, "reown").Move(ctx, 1, tc.addrs[0]))
	ta2 := openTable(t, ctx, a, "reown")
	require.NotSame(t, ta, ta2, "a second handle")
	require.NoError(t, ta2.Own(ctx, 0), "owned again through another handle of the Node")
	requireBalance(t, ctx, ta2, x, dst, 9, "a stale cached row, after owning a released partition again")
}

// A Node owns a partition again after releasing it, as players move between servers and
// back: a releases, b owns it and writes, releases, and a owns it again through the same
// handle, reads b's write (not the row its cache held before the release) and writes on,
// its pin taken again; then b takes it back and reads a's last write (in WriteBack, with a
// flush period that never comes, only Release's flush writes it). Three rounds. Before,
// a's second Own failed with ErrReleased for the Node's life.
func TestOwnAgainAfterRelease(t *testing.T) {
	eachDurability(t, func(t *testing.T, mode txnode.Durability) {
		ctx := testCtx(t)
		tc := startCluster(t, 1)
		cfg := func(owner uint64, addr string) node.Config {
			return node.Config{Session: cluster.SessionConfig{Owner: owner, Addr: addr, TTL: time.Hour},
				Durability: mode, FlushInterval: 1 << 40}
		}
		a := tc.openConfig(t, cfg(0xa, "game-a:7000"))
		b := tc.openConfig(t, cfg(0xb, "game-b:7000"))
		ta := createTable(t, ctx, a, "again", 64, 2, 1, tc.addrs)
		tb := openTable(t, ctx, b, "again")
		require.NoError(t, ta.Own(ctx, 0))
		x := insertRow(t, ctx, ta, balanceRow(1))
		require.EqualValues(t, 0, ta.Partition(x))
		dst := make([]byte, 64)
		v := uint64(1)
		for round := range 3 {
			require.NoError(t, ta.Pin(ctx, 0), "round %d", round)
			v++
			require.NoError(t, ta.Put(ctx, x, balanceRow(v)))
			require.NoError(t, ta.Get(ctx, x, dst)) // cached at a
			require.NoError(t, ta.Release(ctx, 0))
			require.Equal(t, node.OwnReleased, ta.OwnState(0))

			require.NoError(t, tb.Own(ctx, 0), "round %d: b owns the released partition at once", round)
			requireBalance(t, ctx, tb, x, dst, v, "round %d: a's last write before its Release", round)
			v++
			require.NoError(t, tb.Put(ctx, x, balanceRow(v)))
			err := ta.Own(ctx, 0)
			var ne *node.NotOwnerError
			require.ErrorAs(t, err, &ne, "round %d: b holds it", round)
			require.Equal(t, "game-b:7000", ne.Holder.Addr)
			require.NoError(t, tb.Release(ctx, 0))

			require.NoError(t, ta.Own(ctx, 0), "round %d: a owns it again", round)
			require.Equal(t, node.OwnHeld, ta.OwnState(0))
			require.Equal(t, []uint32{0}, ta.Owned())
			requireBalance(t, ctx, ta, x, dst, v, "round %d: b's write, not a's cached row", round)
			require.False(t, ta.Stats()[0].Pinned, "round %d: the pin went with the release", round)
			v++
			require.NoError(t, ta.Put(ctx, x, balanceRow(v)))
			id := insertRow(t, ctx, ta, balanceRow(v))
			require.EqualValues(t, 0, ta.Partition(id))
			require.NoError(t, a.Update(ctx, func(tx *node.Tx) error { return tx.Put(ta, id, balanceRow(v+1)) }))
		}
		require.NoError(t, ta.Release(ctx, 0))
		require.NoError(t, tb.Own(ctx, 0))
		requireBalance(t, ctx, tb, x, dst, v, "a's last write, read by b")
	})
}

// A Node owns a partition again after losing its grant: its owner key deleted, b owns the
// partition and writes; a's write fails naming b (OwnLost); once b releases it, a owns it
// again (a new grant) and reads b's write, and writes on.
func TestOwnAgainAfterLostGrant(t *testing.T) {
	ctx := testCtx(t)
	tc := startCluster(t, 1)
	a := tc.openConfig(t, node.Config{Session: cluster.SessionConfig{Owner: 0xa, Addr: "game-a:7000", TTL: time.Hour}})
	b := tc.openConfig(t, node.Config{Session: cluster.SessionConfig{Owner: 0xb, Addr: "game-b:7000", TTL: time.Hour}})
	ta := createTable(t, ctx, a, "lostagain", 64, 2, 1, tc.addrs)
	tb := openTable(t, ctx, b, "lostagain")
	x, y := ownTwoRows(t, ctx, ta)
	dst := make([]byte, 64)
	require.NoError(t, ta.Get(ctx, x, dst)) // cached at a

	tc.deleteOwnerKey(t, ctx, "lostagain", 0)
	require.NoError(t, tb.Own(ctx, 0))
	require.NoError(t, tb.Put(ctx, x, balanceRow(5)))
	var ne *node.NotOwnerError
	require.ErrorAs(t, ta.Put(ctx, x, balanceRow(6)), &ne, "a's write after its grant was lost")
	require.Equal(t, "game-b:7000", ne.Holder.Addr)
	require.Equal(t, node.OwnLost, ta.OwnState(0))
	require.ErrorAs(t, ta.Own(ctx, 0), &ne, "b holds it")
	require.Equal(t, node.OwnLost, ta.OwnState(0), "a refused Own changes nothing")

	require.NoError(t, tb.Release(ctx, 0))
	require.NoError(t, ta.Own(ctx, 0), "a owns the partition it lost again")
	require.Equal(t, node.OwnHeld, ta.OwnState(0))
	requireBalance(t, ctx, ta, x, dst, 5, "b's write, not a's cached row")
	require.NoError(t, ta.Put(ctx, x, balanceRow(7)))
	require.NoError(t, ta.Put(ctx, y, balanceRow(8)), "partition 1 was never lost")
	require.ElementsMatch(t, []uint32{0, 1}, ta.Owned())
	require.NoError(t, ta.Release(ctx, 0))
	require.NoError(t, tb.Own(ctx, 0))
	requireBalance(t, ctx, tb, x, dst, 7)
}

// A Node owns a partition again after the storage node fenced its grant: a, cut off from
// etcd, does not hear that its owner key went; b owns the partition and writes, and a's
// write is refused by the storage node (storenode.ErrFenced). Once a hears etcd again and b
// releases the partition, a owns it again (its fenced table state forgotten, a new grant)
// and reads b's write.
func TestOwnAgainAfterFence(t *testing.T) {
	ctx := testCtx(t)
	tc := startCluster(t, 1)
	px, err := etcdtest.NewProxy(tc.etcd.Addr())
	require.NoError(t, err)
	t.Cleanup(px.Close)
	a := tc.openConfig(t, node.Config{Etcd: cluster.Config{Endpoints: []string{px.Endpoint()}},
		Session:            cluster.SessionConfig{Owner: 0xa, Addr: "game-a:7000", TTL: time.Hour},
		OwnerLookupTimeout: 300 * time.Millisecond})
	b := tc.openConfig(t, node.Config{Session: cluster.SessionConfig{Owner: 0xb, Addr: "game-b:7000", TTL: time.Hour}})
	ta := createTable(t, ctx, a, "fenceagain", 64, 1, 1, tc.addrs)
	tb := openTable(t, ctx, b, "fenceagain")
	require.NoError(t, ta.Own(ctx, 0))
	x := insertRow(t, ctx, ta, balanceRow(1))

	px.Cut(true) // a hears nothing of what follows
	tc.deleteOwnerKey(t, ctx, "fenceagain", 0)
	require.NoError(t, tb.Own(ctx, 0))
	require.NoError(t, tb.Put(ctx, x, balanceRow(2)))
	err = ta.Put(ctx, x, balanceRow(3))
	require.ErrorIs(t, err, node.ErrNotOwner, "a's fenced write")
	require.ErrorIs(t, err, storenode.ErrFenced)
	require.Equal(t, node.OwnLost, ta.OwnState(0))
	px.Cut(false)

	require.NoError(t, tb.Release(ctx, 0))
	require.NoError(t, ta.Own(ctx, 0), "a owns the partition whose grant was fenced again")
	dst := make([]byte, 64)
	requireBalance(t, ctx, ta, x, dst, 2, "b's write")
	require.NoError(t, ta.Put(ctx, x, balanceRow(4)))
	require.NoError(t, ta.Release(ctx, 0))
	require.NoError(t, tb.Own(ctx, 0))
	requireBalance(t, ctx, tb, x, dst, 4)
}

// A Node owns a partition on a storage node it owned it on before, after the partition
// moved away and back: a's table state there (retired by the first move, dropped at the
// second) is forgotten and the fresh copy owned under the grant the moves kept, through the
// same handle. Then the same after a release: a owns it again on the storage node it is
// back on. Before, a could not own the fresh copy until it was reopened
// (TestMoveBackToFormerNode's owner was a node that never owned it there).
func TestOwnAgainAfterMoveAwayAndBack(t *testing.T) {
	ctx := testCtx(t)
	tc := startCluster(t, 2)
	a := tc.open(t, 0xa, "game-a:7000")
	mover := tc.open(t, 0xb, "game-b:7000")
	ta := createTable(t, ctx, a, "awayback", 64, 2, 1, tc.addrs)
	require.Equal(t, tc.addrs[0], ta.Map().Nodes[0])
	require.NoError(t, ta.Own(ctx, 0))
	x := insertRow(t, ctx, ta, balanceRow(1))
	require.EqualValues(t, 0, ta.Partition(x))
	mt := openTable(t, ctx, mover, "awayback")
	put := func(v uint64) {
		t.Helper()
		var err error
		for try := 0; try < 10; try++ { // the *NotOwnerErrors of a move are retried
			if err = ta.Put(ctx, x, balanceRow(v)); err == nil {
				return
			}
		}
		require.NoError(t, err)
	}

	require.NoError(t, mt.Move(ctx, 0, tc.addrs[1]))
	put(2)
	require.Equal(t, tc.addrs[1], ta.NodeOf(x))
	require.NoError(t, mt.Move(ctx, 0, tc.addrs[0]), "back to the storage node a owned it on")
	put(3)
	require.Equal(t, tc.addrs[0], ta.NodeOf(x))
	require.Equal(t, node.OwnHeld, ta.OwnState(0))
	dst := make([]byte, 64)
	requireBalance(t, ctx, ta, x, dst, 3)

	// Released, moved away and back again by the mover, owned again by a.
	require.NoError(t, ta.Release(ctx, 0))
	require.NoError(t, mt.Move(ctx, 0, tc.addrs[1]))
	require.NoError(t, mt.Move(ctx, 0, tc.addrs[0]))
	require.NoError(t, ta.Own(ctx, 0), "owned again where it is back")
	require.Equal(t, tc.addrs[0], ta.NodeOf(x))
	requireBalance(t, ctx, ta, x, dst, 3)
	put(4)
	require.NoError(t, ta.Release(ctx, 0))
	requireBalance(t, ctx, mt, x, dst, 4, "the mover's durable read of a's last write")
}
