package fencetest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/etcdtest"
	"github.com/weftdb/weft/internal/testkit"
	"github.com/weftdb/weft/logicpage"
	"github.com/weftdb/weft/storenode"
)

const prefix = "/fencetest/"

// testCtx bounds every wait of a test.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func connect(t *testing.T, endpoints []string) *cluster.Client {
	t.Helper()
	c, err := cluster.Connect(testCtx(t), cluster.Config{Endpoints: endpoints, Prefix: prefix, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

func newSession(t *testing.T, c *cluster.Client, owner uint64, ttl time.Duration) *cluster.Session {
	t.Helper()
	s, err := c.NewSession(testCtx(t), cluster.SessionConfig{Owner: owner, TTL: ttl})
	require.NoError(t, err)
	testkit.CloseAtCleanup(t, 5*time.Second, s.Close)
	return s
}

// acctCluster starts an etcd server, connects a client to it and creates the table "acct" of
// partitions partitions (one stripe page each) on storage nodes n0:1, n1:1, ....
func acctCluster(t *testing.T, ctx context.Context, partitions int) (*etcdtest.Server, *cluster.Client) {
	t.Helper()
	srv := etcdtest.Start(t)
	c := connect(t, srv.Endpoints())
	nodes := make([]string, partitions)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("n%d:1", i)
	}
	_, err := c.CreateTable(ctx, "acct", cluster.Layout{Partitions: uint32(partitions), StripePages: 1}, nodes)
	require.NoError(t, err)
	return srv, c
}

// proxiedClient is a client of srv through a proxy the test can cut (closed at its end).
func proxiedClient(t *testing.T, srv *etcdtest.Server) (*etcdtest.Proxy, *cluster.Client) {
	t.Helper()
	px, err := etcdtest.NewProxy(srv.Addr())
	require.NoError(t, err)
	t.Cleanup(px.Close)
	return px, connect(t, []string{px.Endpoint()})
}

// verifiedAcct starts acctCluster's etcd with "acct" of two partitions, and returns its
// client, a proxy to the etcd the test can cut, and a grant verifier (fenced:
// storenode.ErrFenced) whose own client goes through that proxy.
func verifiedAcct(t *testing.T, ctx context.Context) (*cluster.Client, *etcdtest.Proxy, *cluster.GrantVerifier) {
	t.Helper()
	srv, c := acctCluster(t, ctx, 2)
	px, vc := proxiedClient(t, srv)
	return c, px, cluster.NewGrantVerifier(vc, storenode.ErrFenced)
}

func row(v uint64) []byte {
	b := make([]byte, 64)
	for i := range 8 {
		binary.LittleEndian.PutUint64(b[i*8:], v+uint64(i))
	}
	return b
}

func oneRow(table uint32, id uint64, r []byte) base.Segment {
	page, slot := logicpage.PageOf(id)
	return base.Segment{Table: table, Page: page, Data: 1 << slot, Rows: r}
}

// storedRows returns every row of table in e: id -> first word.
func storedRows(t *testing.T, e *storenode.Engine, table uint32) map[uint64]uint64 {
	t.Helper()
	out := map[uint64]uint64{}
	pages, _, err := e.PageDir(table, 0, logicpage.TablePagesMax, storenode.PageDirEntriesMax, nil)
	require.NoError(t, err)
	for _, p := range pages {
		data, _, rows, err := e.ReadRows(table, p.Page, p.Present, nil)
		require.NoError(t, err)
		k := 0
		for m := data; m != 0; m &= m - 1 {
			slot := uint64(0)
			for m>>slot&1 == 0 {
				slot++
			}
			out[p.Page*64+slot] = binary.LittleEndian.Uint64(rows[k*64:])
			k++
		}
	}
	return out
}

// A storage node takes an etcd grant only after reading its owner key (never on trust): a
// forged owner or epoch is refused, so is a lower revision after a higher one, and that floor
// survives a restart; etcd unreachable refuses nothing for good (ErrGrantUnverified, then the
// grant goes through).
func TestRegisterVerifiedInEtcd(t *testing.T) {
	ctx := testCtx(t)
	c, px, v := verifiedAcct(t, ctx)
	var _ storenode.GrantVerifier = v

	dir := t.TempDir()
	opts := storenode.Options{Dir: dir, Sync: storenode.SyncNone, GrantVerifier: v, GrantVerifyTimeout: 2 * time.Second}
	e, err := storenode.Open(opts)
	require.NoError(t, err)
	defer func() { e.Close() }()
	ti, err := e.CreateClusterTable(base.PartitionTableName("acct", 1), 64,
		base.ClusterLayout{Partitions: 2, StripePages: 1, Partition: 1})
	require.NoError(t, err)

	const a, b = 101, 202
	sa := newSession(t, c, a, 0)
	sb := newSession(t, c, b, 0)
	oa, err := sa.Acquire(ctx, "acct", 1)
	require.NoError(t, err)
	ea := oa.Epoch()
	// Forged: a's epoch claimed by b, a with an epoch etcd never gave it, another partition's.
	_, err = e.RegisterGrant(ctx, ti.ID, b, ea)
	require.ErrorIs(t, err, storenode.ErrFenced)
	_, err = e.RegisterGrant(ctx, ti.ID, a, ea+1)
	require.ErrorIs(t, err, storenode.ErrFenced)
	o0, err := sb.Acquire(ctx, "acct", 0)
	require.NoError(t, err)
	_, err = e.RegisterGrant(ctx, ti.ID, b, o0.Epoch())
	require.ErrorIs(t, err, storenode.ErrFenced, "a grant of partition 0 for the table of partition 1")

	// etcd cut off from the storage node: not verified, nothing changed; then verified.
	px.Cut(true)
	_, err = e.RegisterGrant(ctx, ti.ID, a, ea)
	require.ErrorIs(t, err, storenode.ErrGrantUnverified)
	px.Cut(false)
	// The client reconnects in its own time: ErrGrantUnverified means "retry later".
	for {
		_, err = e.RegisterGrant(ctx, ti.ID, a, ea)
		if !errors.Is(err, storenode.ErrGrantUnverified) || ctx.Err() != nil {
			break
		}
	}
	require.NoError(t, err)
	first, _, err := e.AllocIDs(ti.ID, a, ea, 1)
	require.NoError(t, err)
	_, err = e.CommitWait(&base.Batch{Owner: a, Seq: 1, Fences: []base.Fence{{Table: ti.ID, Epoch: ea}},
		Segments: []base.Segment{oneRow(ti.ID, first, row(1))}})
	require.NoError(t, err)

	// b takes over: a's batches are fenced from the registration on.
	require.NoError(t, oa.Release(ctx))
	ob, err := sb.Acquire(ctx, "acct", 1)
	require.NoError(t, err)
	require.Greater(t, ob.Epoch(), ea)
	_, err = e.RegisterGrant(ctx, ti.ID, b, ob.Epoch())
	require.NoError(t, err)
	_, err = e.CommitWait(&base.Batch{Owner: a, Seq: 2, Fences: []base.Fence{{Table: ti.ID, Epoch: ea}},
		Segments: []base.Segment{oneRow(ti.ID, first+1, row(2))}})
	require.ErrorIs(t, err, storenode.ErrFenced)

	// a acquires again (a new owner key, above b's) while b still holds the storage node's
	// grant: b released first, so a's new grant is current and goes through; then the old
	// revision of a, below the floor, never does, across a restart.
	require.NoError(t, ob.Release(ctx))
	oa2, err := sa.Acquire(ctx, "acct", 1)
	require.NoError(t, err)
	_, err = e.RegisterGrant(ctx, ti.ID, a, oa2.Epoch())
	require.NoError(t, err)
	require.NoError(t, e.Close())
	e, err = storenode.Open(opts)
	require.NoError(t, err)
	_, err = e.RegisterGrant(ctx, ti.ID, b, ob.Epoch())
	require.ErrorIs(t, err, storenode.ErrFenced, "the floor persists across a restart")
	_, err = e.RegisterGrant(ctx, ti.ID, a, ea)
	require.ErrorIs(t, err, storenode.ErrFenced)
	_, err = e.RegisterGrant(ctx, ti.ID, a, oa2.Epoch())
	require.NoError(t, err, "the current grant is renewed after a restart: no storage-node lease applies")
	require.Equal(t, map[uint64]uint64{first: 1}, storedRows(t, e, ti.ID))
}

// A restored copy raises its cluster tables' floor to etcd's revision at first open: the
// grants made before (and after) the backup are refused, the next one is accepted.
func TestRestoredCopyFloorFromEtcd(t *testing.T) {
	ctx := testCtx(t)
	_, c := acctCluster(t, ctx, 1)
	v := cluster.NewGrantVerifier(c, storenode.ErrFenced)
	e, err := storenode.Open(storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone, GrantVerifier: v})
	require.NoError(t, err)
	defer e.Close()
	ti, err := e.CreateClusterTable(base.PartitionTableName("acct", 0), 64, base.ClusterLayout{Partitions: 1, StripePages: 1})
	require.NoError(t, err)
	sa := newSession(t, c, 1, 0)
	oa, err := sa.Acquire(ctx, "acct", 0)
	require.NoError(t, err)
	_, err = e.RegisterGrant(ctx, ti.ID, 1, oa.Epoch())
	require.NoError(t, err)

	dir := filepath.Join(t.TempDir(), "copy")
	d, err := storenode.NewBackupDir(nil, dir)
	require.NoError(t, err)
	info, err := e.Backup(ctx, d)
	require.NoError(t, err)
	require.NoError(t, d.Finish(info))
	require.NoError(t, d.Close())

	// The restored copy opens: a's grant, still current in etcd, is refused there (a must
	// release and acquire again); the next grant is accepted.
	cp, err := storenode.Open(storenode.Options{Dir: dir, Sync: storenode.SyncNone, GrantVerifier: v})
	require.NoError(t, err)
	defer cp.Close()
	_, err = cp.RegisterGrant(ctx, ti.ID, 1, oa.Epoch())
	require.ErrorIs(t, err, storenode.ErrFenced)
	require.NoError(t, oa.Release(ctx))
	oa2, err := sa.Acquire(ctx, "acct", 0)
	require.NoError(t, err)
	g, err := cp.RegisterGrant(ctx, ti.ID, 1, oa2.Epoch())
	require.NoError(t, err)
	require.Equal(t, oa2.Epoch(), g.Epoch, "the floor is etcd's revision, not 2^32 above it")
	// The original still takes it too: the copy is another store.
	_, err = e.RegisterGrant(ctx, ti.ID, 1, oa2.Epoch())
	require.NoError(t, err)
}
