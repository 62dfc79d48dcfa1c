package fencetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/storenode"
)

// A cluster-managed table has no lease at the storage node (its grants are etcd's), so the
// lease check of a drop never stopped anyone: on cfcf39b any owner dropped the copy while
// another's etcd grant was current. Now only the registered holder drops it, or anyone once
// etcd's partition map no longer has the table; with etcd cut off, the drop is refused as
// unverified, not let through.
func TestClusterTableDropOnlyByHolderOrUnmapped(t *testing.T) {
	ctx := testCtx(t)
	c, px, v := verifiedAcct(t, ctx)
	var _ storenode.TableMapVerifier = v
	e, err := storenode.Open(storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone, GrantVerifier: v,
		GrantVerifyTimeout: 2 * time.Second})
	require.NoError(t, err)
	defer func() { e.Close() }()
	l := base.ClusterLayout{Partitions: 2, StripePages: 1}
	n0, n1 := base.PartitionTableName("acct", 0), base.PartitionTableName("acct", 1)
	t0, err := e.CreateClusterTable(n0, 64, l)
	require.NoError(t, err)
	l.Partition = 1
	t1, err := e.CreateClusterTable(n1, 64, l)
	require.NoError(t, err)

	const a, b = 101, 202
	sa := newSession(t, c, a, 0)
	for _, ti := range []base.TableInfo{t0, t1} {
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

// A cluster table with no registered holder (created, its grant not registered yet; or a
// restored copy, whose first open clears the holder) and a holder whose etcd grant another
// node has taken since (not registered here yet) are no better placed than any other owner:
// the drop needs the table gone from etcd's map. On 9594289 the holderless table and the
// lapsed holder's copy were dropped while mapped and granted to another node.
func TestClusterTableDropHolderlessOrLapsedHolder(t *testing.T) {
	ctx := testCtx(t)
	_, c := acctCluster(t, ctx, 2)
	v := cluster.NewGrantVerifier(c, storenode.ErrFenced)
	e, err := storenode.Open(storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone, GrantVerifier: v,
		GrantVerifyTimeout: 5 * time.Second})
	require.NoError(t, err)
	defer func() { e.Close() }()
	l := base.ClusterLayout{Partitions: 2, StripePages: 1}
	n0, n1 := base.PartitionTableName("acct", 0), base.PartitionTableName("acct", 1)
	_, err = e.CreateClusterTable(n0, 64, l)
	require.NoError(t, err)
	l.Partition = 1
	t1, err := e.CreateClusterTable(n1, 64, l)
	require.NoError(t, err)

	const a, b = 101, 202
	require.ErrorIs(t, e.DropTable(n0, b), storenode.ErrTableOwned, "no holder registered, the table still mapped")

	sa, sb := newSession(t, c, a, 0), newSession(t, c, b, 0)
	oa, err := sa.Acquire(ctx, "acct", 1)
	require.NoError(t, err)
	_, err = e.RegisterGrant(ctx, t1.ID, a, oa.Epoch())
	require.NoError(t, err)
	require.NoError(t, oa.Release(ctx))
	_, err = sb.Acquire(ctx, "acct", 1)
	require.NoError(t, err)
	require.ErrorIs(t, e.DropTable(n1, a), storenode.ErrTableOwned, "a's grant is b's now in etcd")

	require.NoError(t, c.DropTable(ctx, "acct"))
	require.NoError(t, e.DropTable(n0, b), "gone from etcd's map")
	require.NoError(t, e.DropTable(n1, a), "gone from etcd's map")
	require.Empty(t, e.Tables())
}
