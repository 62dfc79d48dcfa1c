package cluster

import (
	"testing"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weftdb/weft/cluster/etcdtest"
	"github.com/weftdb/weft/internal/corrupt"
)

func TestMapCreateReadDrop(t *testing.T) {
	ctx := testCtx(t)
	c := sharedClient(t)
	nodes := []string{"127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7001"}
	l := Layout{Partitions: 3, StripePages: 2}
	tm, err := c.CreateTable(ctx, "accounts", l, nodes)
	require.NoError(t, err)
	require.Equal(t, nodes, tm.Nodes)
	require.Positive(t, tm.Created)

	_, err = c.CreateTable(ctx, "accounts", l, nodes)
	require.ErrorIs(t, err, ErrTableExists)
	_, err = c.CreateTable(ctx, "other", l, nodes[:2])
	require.ErrorIs(t, err, ErrInvalid, "a node per partition")
	_, err = c.CreateTable(ctx, "a/b", l, nodes)
	require.ErrorIs(t, err, ErrInvalid)

	m, err := c.ReadMap(ctx)
	require.NoError(t, err)
	got, err := m.Table("accounts")
	require.NoError(t, err)
	require.Equal(t, tm, got)
	require.Equal(t, "127.0.0.1:7002", got.NodeOf(128)) // page 2 -> stripe 1 -> partition 1
	_, err = m.Table("missing")
	require.ErrorIs(t, err, ErrTableNotFound)

	require.NoError(t, c.DropTable(ctx, "accounts"))
	require.ErrorIs(t, c.DropTable(ctx, "accounts"), ErrTableNotFound)
	m, err = c.ReadMap(ctx)
	require.NoError(t, err)
	require.Empty(t, m.Tables)
	// The name is free again, with a new creation revision.
	tm2, err := c.CreateTable(ctx, "accounts", l, nodes)
	require.NoError(t, err)
	require.Greater(t, tm2.Created, tm.Created)
}

// StorageNodes lists every node the map names, once each: the addresses a storage node's
// resolver may dial (server.PeerDirectory).
func TestMapStorageNodes(t *testing.T) {
	ctx := testCtx(t)
	c := sharedClient(t)
	nodes, err := c.StorageNodes(ctx)
	require.NoError(t, err)
	require.Empty(t, nodes)
	_, err = c.CreateTable(ctx, "a", Layout{Partitions: 3, StripePages: 2}, []string{"127.0.0.1:7002", "127.0.0.1:7001", "127.0.0.1:7002"})
	require.NoError(t, err)
	_, err = c.CreateTable(ctx, "b", Layout{Partitions: 1, StripePages: 2}, []string{"127.0.0.1:7003"})
	require.NoError(t, err)
	nodes, err = c.StorageNodes(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"}, nodes)
	require.NoError(t, c.DropTable(ctx, "b"))
	nodes, err = c.StorageNodes(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"127.0.0.1:7001", "127.0.0.1:7002"}, nodes)
}

// The switch is a compare-and-set on the partition's revision: a switch from a stale read
// changes nothing; so does one for a table dropped and created again.
func TestMapSwitchIsCompareAndSet(t *testing.T) {
	ctx := testCtx(t)
	c := sharedClient(t)
	tm, err := c.CreateTable(ctx, "t", Layout{Partitions: 2, StripePages: 1}, []string{"a:1", "b:1"})
	require.NoError(t, err)
	rev, err := c.SwitchPartition(ctx, "t", tm.Created, 1, tm.Revs[1], "c:1")
	require.NoError(t, err)
	require.Greater(t, rev, tm.Revs[1])
	// The same stale read again: refused, nothing changed.
	_, err = c.SwitchPartition(ctx, "t", tm.Created, 1, tm.Revs[1], "d:1")
	require.ErrorIs(t, err, ErrMapChanged)
	m, err := c.ReadMap(ctx)
	require.NoError(t, err)
	got, _ := m.Table("t")
	require.Equal(t, []string{"a:1", "c:1"}, got.Nodes)
	require.Equal(t, rev, got.Revs[1])
	require.Equal(t, tm.Revs[0], got.Revs[0], "the other partition's entry is untouched")

	// An extra condition that fails blocks the switch.
	_, err = c.SwitchPartition(ctx, "t", tm.Created, 0, tm.Revs[0], "d:1",
		clientv3.Compare(clientv3.CreateRevision(c.keys.owner("t", 0)), ">", 0))
	require.ErrorIs(t, err, ErrMapChanged)

	require.NoError(t, c.DropTable(ctx, "t"))
	_, err = c.SwitchPartition(ctx, "t", tm.Created, 0, tm.Revs[0], "d:1")
	require.ErrorIs(t, err, ErrTableNotFound)
	tm2, err := c.CreateTable(ctx, "t", Layout{Partitions: 2, StripePages: 1}, []string{"a:1", "b:1"})
	require.NoError(t, err)
	_, err = c.SwitchPartition(ctx, "t", tm.Created, 0, tm2.Revs[0], "d:1")
	require.ErrorIs(t, err, ErrMapChanged, "a table created again is another table")
}

// Concurrent switches of one partition from the same read: exactly one wins.
func TestMapSwitchRace(t *testing.T) {
	ctx := testCtx(t)
	c := sharedClient(t)
	tm, err := c.CreateTable(ctx, "t", Layout{Partitions: 1, StripePages: 1}, []string{"a:1"})
	require.NoError(t, err)
	rounds, racers := 8, 6
	if testing.Short() {
		rounds, racers = 3, 4
	}
	rev := tm.Revs[0]
	for r := 0; r < rounds; r++ {
		type res struct {
			rev int64
			err error
		}
		ch := make(chan res, racers)
		for i := 0; i < racers; i++ {
			go func() {
				nr, err := c.SwitchPartition(ctx, "t", tm.Created, 0, rev, "n:1")
				ch <- res{nr, err}
			}()
		}
		wins := 0
		for i := 0; i < racers; i++ {
			x := <-ch
			if x.err == nil {
				wins++
				require.Greater(t, x.rev, rev)
				rev = x.rev
			} else {
				require.ErrorIs(t, x.err, ErrMapChanged)
			}
		}
		require.Equal(t, 1, wins, "round %d", r)
	}
}

// The watcher's copy follows creations, switches and drops, in order; WaitRevision and Sync
// wait for it; a value that fails to decode shows as a broken table, not as a table.
func TestMapWatcher(t *testing.T) {
	ctx := testCtx(t)
	c := sharedClient(t)
	w, err := c.WatchMap(ctx)
	require.NoError(t, err)
	defer w.Close()
	require.Empty(t, w.Map().Tables)

	tm, err := c.CreateTable(ctx, "t", Layout{Partitions: 4, StripePages: 1}, []string{"a:1", "a:1", "b:1", "b:1"})
	require.NoError(t, err)
	m, err := w.WaitRevision(ctx, tm.Created)
	require.NoError(t, err)
	got, err := m.Table("t")
	require.NoError(t, err)
	require.Equal(t, tm, got)

	rev, err := c.SwitchPartition(ctx, "t", tm.Created, 3, tm.Revs[3], "c:1")
	require.NoError(t, err)
	m, err = w.WaitRevision(ctx, rev)
	require.NoError(t, err)
	got, _ = m.Table("t")
	require.Equal(t, "c:1", got.Nodes[3])
	require.Equal(t, rev, got.Revs[3])
	require.Equal(t, "a:1", tm.Nodes[0])
	require.Equal(t, "b:1", tm.Nodes[3], "a snapshot handed out never changes")

	// A foreign writer's junk: the table is broken, with a corruption error.
	_, err = c.cli.Put(ctx, c.keys.part("t", 2), "junk")
	require.NoError(t, err)
	m, err = w.Sync(ctx)
	require.NoError(t, err)
	_, err = m.Table("t")
	require.ErrorIs(t, err, corrupt.ErrCorruption)

	// Sync catches up with a revision that changed no map key (a progress notification).
	pr, err := c.cli.Put(ctx, newPrefix(t)+"unrelated", "x")
	require.NoError(t, err)
	m, err = w.Sync(ctx)
	require.NoError(t, err)
	require.GreaterOrEqual(t, m.Revision, pr.Header.Revision)

	require.NoError(t, c.DropTable(ctx, "t"))
	m, err = w.Sync(ctx)
	require.NoError(t, err)
	_, err = m.Table("t")
	require.ErrorIs(t, err, ErrTableNotFound)
	require.Empty(t, m.Broken)
}

// A watcher cut off while etcd compacts past its revision reads the map afresh when it is
// back, and so does a session's owner-key watch (it reads its owner keys): nothing missed.
func TestWatchersAfterCompaction(t *testing.T) {
	ctx := testCtx(t)
	srv := etcdtest.Start(t)
	c := connect(t, "/weft/", srv.Endpoints()...)
	p := newProxy(t, srv.Addr())
	cp := connect(t, "/weft/", p.Endpoint())
	tm := createTable(t, c, "t", 2)
	w, err := cp.WatchMap(ctx)
	require.NoError(t, err)
	defer w.Close()
	s := newSession(t, cp, 1, nil)
	o0 := acquire(t, ctx, s, "t", 0)
	o1 := acquire(t, ctx, s, "t", 1)

	p.Cut(true)
	rev, err := c.SwitchPartition(ctx, "t", tm.Created, 1, tm.Revs[1], "moved:1")
	require.NoError(t, err)
	_, err = c.cli.Delete(ctx, c.keys.owner("t", 1)) // an operator's delete, compacted away below
	require.NoError(t, err)
	pr, err := c.cli.Put(ctx, "/elsewhere", "x") // so the compaction is past both
	require.NoError(t, err)
	_, err = c.cli.Compact(ctx, pr.Header.Revision)
	require.NoError(t, err)
	p.Cut(false)

	m, err := w.WaitRevision(ctx, rev)
	require.NoError(t, err)
	got, err := m.Table("t")
	require.NoError(t, err)
	require.Equal(t, "moved:1", got.Nodes[1])
	select {
	case <-o1.Done():
	case <-ctx.Done():
		t.Fatal("the deleted owner key was never noticed after the compaction")
	}
	require.ErrorIs(t, o1.Check(), ErrLost)
	requireServing(t, o0)
}
