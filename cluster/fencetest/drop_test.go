package fencetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/etcdtest"
	"github.com/weftdb/weft/storenode"
)

// A cluster-managed table has no lease at the storage node (its grants are etcd's), so the
// lease check of a drop never stopped anyone: on cfcf39b any owner dropped the copy while
// another's etcd grant was current. Now only the registered holder drops it, or anyone once
// etcd's partition map no longer has the table; with etcd cut off, the drop is refused as
// unverified, not let through.
func TestClusterTableDropOnlyByHolderOrUnmapped(t *testing.T) {
	ctx := testCtx(t)
	srv := etcdtest.Start(t)
	c := connect(t, srv.Endpoints())
	_, err := c.CreateTable(ctx, "acct", cluster.Layout{Partitions: 2, StripePages: 1}, []string{"n0:1", "n1:1"})
	require.NoError(t, err)
	px, err := etcdtest.NewProxy(srv.Addr())
	require.NoError(t, err)
	t.Cleanup(px.Close)
	vc := connect(t, []string{px.Endpoint()})
	v := cluster.NewGrantVerifier(vc, storenode.ErrFenced)
	var _ storenode.TableMapVerifier = v
	e, err := storenode.Open(storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone, GrantVerifier: v,
		GrantVerifyTimeout: 2 * time.Second})
	require.NoError(t, err)
	defer func() { e.Close() }()
	l := storenode.ClusterLayout{Partitions: 2, StripePages: 1}
	n0, n1 := storenode.PartitionTableName("acct", 0), storenode.PartitionTableName("acct", 1)
	t0, err := e.CreateClusterTable(n0, 64, l)
	require.NoError(t, err)
	l.Partition = 1
	t1, err := e.CreateClusterTable(n1, 64, l)
	require.NoError(t, err)

	const a, b = 101, 202
	sa := newSession(t, c, a, 0)
	for _, ti := range []storenode.TableInfo{t0, t1} {
		o, err := sa.Acquire(ctx, "acct", ti.Cluster.Partition)
		require.NoError(t, err)
		_, err = e.RegisterGrant(ctx, ti.ID, a, o.Epoch())
		require.NoError(t, err)
	}

	require.ErrorIs(t, e.DropTable(n0, b), storenode.ErrTableOwned, "another owner, the table still mapped")
	px.Cut(true)
	require.ErrorIs(t, e.DropTable(n0, b), storenode.ErrGrantUnverified, "etcd cannot say")
	px.Cut(false)
	require.NoError(t, e.DropTable(n0, a), "the holder drops its copy")

	require.NoError(t, c.DropTable(ctx, "acct"))
	require.NoError(t, e.DropTable(n1, b), "gone from etcd's map: anyone drops the copy")
	require.Empty(t, e.Tables())
}
