package node_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/txnode"
)

// Table.Release gives up one partition without closing the Node: another node's Own of it
// succeeds at once (Own, not OwnWait, under an hour-long TTL: no lease is waited out), and
// reads the releasing node's last acknowledged write (in WriteBack mode, with a flush period
// that never comes, only Release's flush writes it); the released partition's writes from
// the releasing node fail with a *NotOwnerError naming the new holder, its other partition
// keeps working, and it cannot own the released one again while b holds it (a *NotOwnerError
// naming b; once b releases it, a owns it again: own_again_test.go). Releasing it again,
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
		require.NoError(t, tb.Get(ctx, x, dst))
		require.Equal(t, uint64(7), balanceOf(dst), "a's last write before Release, read by the new owner")
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
		require.NoError(t, ta.Get(ctx, x, dst))
		require.Equal(t, uint64(9), balanceOf(dst), "a reads b's durable write")

		// a's other partition keeps working; its inserts go there only.
		require.NoError(t, ta.Put(ctx, y, balanceRow(12)))
		for range 3 {
			require.EqualValues(t, 1, ta.Partition(insertRow(t, ctx, ta, balanceRow(1))))
		}
		require.NoError(t, ta.Get(ctx, y, dst))
		require.Equal(t, uint64(12), balanceOf(dst))

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
		require.NoError(t, tb.Get(ctx, y, dst))
		require.Equal(t, uint64(12), balanceOf(dst))
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
	cli, err := clientv3.New(clientv3.Config{Endpoints: tc.etcd.Endpoints(), DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	require.NoError(t, err)
	defer cli.Close()
	_, err = cli.Delete(ctx, fmt.Sprintf("%sown/st/%08x", prefix, 1))
	require.NoError(t, err)
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
