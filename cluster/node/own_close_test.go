package node_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/storenode"
)

// A table handle opened before its partition was switched to another storage node
// (cluster.Client.SwitchPartition, the switch step of a move) must not own it at the old
// storage node: its writes would land where no reader looks any more. The handle follows the
// map (Own reads it and routes the partition to the new storage node first); OpenTable reads
// the map again and routes to the new storage node too.
func TestOwnAfterSwitchRefused(t *testing.T) {
	ctx := testCtx(t)
	tc, a, ta := startWithTable(t, ctx, 2, 0xa, "game-a:7000", "mv", 2)
	require.Equal(t, tc.addrs[1], ta.Map().Nodes[1])

	// The move's copy on storage node 0, then the switch (no owner holds partition 1).
	_, err := tc.srvs[0].Engine().CreateClusterTable(base.PartitionTableName("mv", 1), 64,
		base.ClusterLayout{Partitions: 2, StripePages: 1, Partition: 1})
	require.NoError(t, err)
	tm := ta.Map()
	_, err = tc.c.SwitchPartition(ctx, "mv", tm.Created, 1, tm.Revs[1], tc.addrs[0])
	require.NoError(t, err)

	// The handle follows the map (follow.go): Own takes partition 1 at its new storage node,
	// never at the old one.
	require.NoError(t, ta.Own(ctx, 1))
	require.EqualValues(t, 1, ta.Partition(64))
	require.Equal(t, tc.addrs[0], ta.NodeOf(64), "the handle owns partition 1 at its old storage node")
	require.Equal(t, []uint32{1}, ta.Owned())

	fresh := openTable(t, ctx, a, "mv")
	require.Equal(t, tc.addrs[0], fresh.Map().Nodes[1], "OpenTable returns the stale handle")
	require.NoError(t, fresh.Own(ctx, 1))
	id := insertRow(t, ctx, fresh, balanceRow(9))
	require.EqualValues(t, 1, fresh.Partition(id))
	require.Equal(t, tc.addrs[0], fresh.NodeOf(id))
	// The row is on storage node 0's copy, where the map says.
	ti, err := tc.srvs[0].Engine().OpenTable(base.PartitionTableName("mv", 1))
	require.NoError(t, err)
	data, _, _, err := tc.srvs[0].Engine().ReadRows(ti.ID, id/64, 1<<(id%64), nil)
	require.NoError(t, err)
	require.Equal(t, uint64(1)<<(id%64), data)
}

// Every method of a closed Node, a Table's and a transaction's included, fails with
// ErrClosed (errors.Is), whichever layer below noticed first.
func TestClosedNodeErrClosed(t *testing.T) {
	ctx := testCtx(t)
	tc, a, ta := startWithTable(t, ctx, 1, 0xa, "game-a:7000", "cl", 2)
	require.NoError(t, ta.Own(ctx, 0))
	id := insertRow(t, ctx, ta, balanceRow(1))
	other := id + 64 // partition 1: not owned
	require.EqualValues(t, 1, ta.Partition(other))
	require.NoError(t, a.Close(ctx))

	dst := make([]byte, 64)
	require.ErrorIs(t, ta.Get(ctx, id, dst), node.ErrClosed, "owned Get")
	require.ErrorIs(t, ta.Get(ctx, other, dst), node.ErrClosed, "durable Get")
	require.ErrorIs(t, ta.Put(ctx, id, balanceRow(2)), node.ErrClosed, "Put")
	require.ErrorIs(t, ta.Update(ctx, id, func([]byte) error { return nil }), node.ErrClosed, "Update")
	require.ErrorIs(t, ta.Delete(ctx, id), node.ErrClosed, "Delete")
	_, err := ta.Insert(ctx, balanceRow(3))
	require.ErrorIs(t, err, node.ErrClosed, "Insert")
	require.ErrorIs(t, ta.Own(ctx, 1), node.ErrClosed, "Own")
	require.ErrorIs(t, a.Update(ctx, func(tx *node.Tx) error { return tx.Put(ta, id, balanceRow(4)) }), node.ErrClosed, "Node.Update")
	_, err = a.OpenTable(ctx, "cl")
	require.ErrorIs(t, err, node.ErrClosed, "OpenTable")
	_, err = a.CreateTable(ctx, "cl2", 64, 2, 1, tc.addrs)
	require.ErrorIs(t, err, node.ErrClosed, "CreateTable")
}

// A grant lost between a transaction's writes and its commit (checked again at commit) fails
// the commit with a *NotOwnerError, as a write refused on the spot does, and the partition is
// no longer listed as owned; nothing is written.
func TestGrantLostBeforeCommitNotOwner(t *testing.T) {
	ctx := testCtx(t)
	tc, a, ta := startWithTable(t, ctx, 1, 0xa, "game-a:7000", "gl", 2)
	require.NoError(t, ta.Own(ctx, 0))
	id := insertRow(t, ctx, ta, balanceRow(1))
	runs := 0
	err := a.Update(ctx, func(tx *node.Tx) error {
		runs++
		if err := tx.Put(ta, id, balanceRow(2)); err != nil {
			return err
		}
		if runs == 1 { // the first run (fn runs once per attempt), after its write: the grant goes
			require.NoError(t, a.Session().Close(ctx))
		}
		return nil
	})
	require.ErrorIs(t, err, node.ErrNotOwner)
	var ne *node.NotOwnerError
	require.ErrorAs(t, err, &ne)
	require.EqualValues(t, 0, ne.Part)
	require.ErrorIs(t, err, cluster.ErrLost)
	require.Empty(t, ta.Owned())

	_, tb := tc.openNodeTable(t, ctx, 0xb, "gl")
	dst := make([]byte, 64)
	requireBalance(t, ctx, tb, id, dst, 1, "the refused commit wrote nothing")
}

// A table dropped from the map (cluster.Client.DropTable) leaves its partition tables on the
// storage nodes, rows and all. CreateTable of the name afresh must not adopt them as the new
// table's (its rows would reappear): it refuses before it writes the map.
func TestCreateTableRefusesDroppedLeftovers(t *testing.T) {
	ctx := testCtx(t)
	tc, a, ta := startWithTable(t, ctx, 2, 0xa, "game-a:7000", "dt", 2)
	require.NoError(t, ta.Own(ctx, 0, 1))
	id := insertRow(t, ctx, ta, balanceRow(5))
	require.NoError(t, a.Close(ctx))
	require.NoError(t, tc.c.DropTable(ctx, "dt"))

	b := tc.open(t, 0xb, "game-b:7000")
	_, err := b.CreateTable(ctx, "dt", 64, 2, 1, tc.addrs)
	require.ErrorIs(t, err, cluster.ErrTableExists, "the dropped table's partition tables taken as the new one's")
	// Either partition's leftover may be named: the storage nodes are listed in map order.
	require.Condition(t, func() bool {
		return strings.Contains(err.Error(), base.PartitionTableName("dt", 0)) ||
			strings.Contains(err.Error(), base.PartitionTableName("dt", 1))
	}, "the error names a leftover partition table: %v", err)
	m, err := tc.c.ReadMap(ctx)
	require.NoError(t, err)
	require.NotContains(t, m.Tables, "dt", "the map is not written")
	_ = id
}

// doneSpy is a context that says when it is first asked for Done: own has begun using it.
type doneSpy struct {
	context.Context
	once  sync.Once
	asked chan struct{}
}

func (c *doneSpy) Done() <-chan struct{} {
	c.once.Do(func() { close(c.asked) })
	return c.Context.Done()
}

// An OwnWait waiting out another node's hold on one partition does not hold up an Own of
// another partition of the table (it took the table-wide lock for its whole wait, and the Own
// waited for it regardless of its context).
func TestOwnNotBlockedByOwnWait(t *testing.T) {
	ctx := testCtx(t)
	tc, _, ta := startWithTable(t, ctx, 1, 0xa, "game-a:7000", "ow", 2)
	require.NoError(t, ta.Own(ctx, 0))
	b := tc.open(t, 0xb, "game-b:7000")
	tb := openTable(t, ctx, b, "ow")

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	spy := &doneSpy{Context: wctx, asked: make(chan struct{})}
	waited := make(chan error, 1)
	go func() { waited <- tb.OwnWait(spy, 0) }()
	<-spy.asked // the OwnWait is under way (a holds partition 0: it waits)

	owned := make(chan error, 1)
	octx, ocancel := context.WithTimeout(ctx, 20*time.Second)
	defer ocancel()
	go func() { owned <- tb.Own(octx, 1) }()
	select {
	case err := <-owned:
		require.NoError(t, err)
	case <-octx.Done():
		cancel()
		<-waited
		t.Fatal("Own of partition 1 blocked behind OwnWait of partition 0, past its context")
	}
	require.Equal(t, []uint32{1}, tb.Owned())
	cancel()
	require.ErrorIs(t, <-waited, context.Canceled)
}

// Close while an OwnWait waits out another node's hold: Close completes, and the OwnWait ends
// with ErrClosed (not the layers' closed errors, nor a wait until its own context ends).
func TestCloseEndsOwnWait(t *testing.T) {
	ctx := testCtx(t)
	tc, _, ta := startWithTable(t, ctx, 1, 0xa, "game-a:7000", "cw", 2)
	require.NoError(t, ta.Own(ctx, 0))
	b := tc.open(t, 0xb, "game-b:7000")
	tb := openTable(t, ctx, b, "cw")

	spy := &doneSpy{Context: ctx, asked: make(chan struct{})}
	waited := make(chan error, 1)
	go func() { waited <- tb.OwnWait(spy, 0) }()
	<-spy.asked
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	require.NoError(t, b.Close(cctx))
	select {
	case err := <-waited:
		require.ErrorIs(t, err, node.ErrClosed)
	case <-cctx.Done():
		t.Fatal("OwnWait still waiting after Close")
	}
	require.Equal(t, []uint32{0}, ta.Owned(), "a keeps its partition")
}

// A node cut off from etcd (its session's deadline not yet passed, so it still serves) whose
// owner key was taken away and given to another node, which registered the new grant with the
// storage node: the storage node fences its write. That refusal is a *NotOwnerError too (the
// holder unknown: etcd unreachable), and the partition is no longer listed as owned; the
// write is not stored.
func TestFencedWriteNotOwner(t *testing.T) {
	ctx := testCtx(t)
	tc := startCluster(t, 1)
	px := tc.etcdProxy(t)
	a := tc.openConfig(t, node.Config{Etcd: cluster.Config{Endpoints: []string{px.Endpoint()}},
		Session:            cluster.SessionConfig{Owner: 0xa, Addr: "game-a:7000", TTL: time.Hour},
		OwnerLookupTimeout: 300 * time.Millisecond})
	b := tc.open(t, 0xb, "game-b:7000")
	ta := createTable(t, ctx, a, "fz", 64, 2, 1, tc.addrs)
	tb := openTable(t, ctx, b, "fz")
	require.NoError(t, ta.Own(ctx, 0))
	id := insertRow(t, ctx, ta, balanceRow(1))
	require.NoError(t, ta.Own(ctx, 1))
	var id1 uint64
	for i := 0; ta.Partition(id1) != 1; i++ {
		require.Less(t, i, 4, "round robin over partitions 0 and 1")
		id1 = insertRow(t, ctx, ta, balanceRow(1))
	}

	px.Cut(true) // a hears nothing of what follows
	tc.deleteOwnerKey(t, ctx, "fz", 0)
	require.NoError(t, tb.Own(ctx, 0), "b takes partition 0 and registers its grant")
	require.NoError(t, tb.Put(ctx, id, balanceRow(2)))

	err := ta.Put(ctx, id, balanceRow(3))
	require.ErrorIs(t, err, node.ErrNotOwner, "a's fenced write")
	var ne *node.NotOwnerError
	require.ErrorAs(t, err, &ne)
	require.ErrorIs(t, err, storenode.ErrFenced)
	require.Equal(t, []uint32{1}, ta.Owned())
	require.ErrorIs(t, ta.Put(ctx, id, balanceRow(4)), node.ErrNotOwner)
	// Partition 1, on the same storage node, is still a's, and its writes go on: the
	// transaction node's commit pipeline failed only what the fenced batch held.
	require.NoError(t, ta.Put(ctx, id1, balanceRow(5)))
	require.Equal(t, []uint32{1}, ta.Owned())
	srv := tc.srvs[0]
	ti, err := srv.Engine().OpenTable(base.PartitionTableName("fz", 0))
	require.NoError(t, err)
	_, _, rows, err := srv.Engine().ReadRows(ti.ID, id/64, 1<<(id%64), nil)
	require.NoError(t, err)
	require.EqualValues(t, 2, balanceOf(rows), "b's write stands; a's is not stored")
	px.Cut(false)
}

// A Node's Close ends every goroutine it started (its transaction nodes', its session's,
// its etcd client's).
func TestCloseLeaksNoGoroutine(t *testing.T) {
	ctx := testCtx(t)
	tc := startCluster(t, 2)
	// Dial the storage nodes once, so their servers' per-connection state exists.
	warm := tc.open(t, 0xc, "")
	createTable(t, ctx, warm, "lk", 64, 4, 1, tc.addrs)
	opts := []goleak.Option{goleak.IgnoreCurrent(),
		goleak.IgnoreTopFunction("github.com/panjf2000/ants/v2.(*goWorker).run.func1")}

	cfg := node.Config{Etcd: cluster.Config{Endpoints: tc.etcd.Endpoints(), Prefix: prefix, Logger: quiet},
		Session: cluster.SessionConfig{Owner: 0xa, Addr: "game-a:7000"}, Logger: quiet, Secret: secret, CacheBytes: 1 << 20}
	a, err := node.Open(ctx, cfg)
	require.NoError(t, err)
	ta := openTable(t, ctx, a, "lk")
	require.NoError(t, ta.Own(ctx, 0, 1, 2, 3))
	for range 8 {
		insertRow(t, ctx, ta, balanceRow(1))
	}
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	require.NoError(t, a.Close(cctx))
	goleak.VerifyNone(t, opts...)
}
