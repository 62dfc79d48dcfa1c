package cluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/weftdb/weft/cluster/etcdtest"
	"github.com/weftdb/weft/internal/corrupt"
)

// A partition entry that failed to decode breaks its table only until that key is written
// (or deleted) again: the watcher's copy then agrees with a fresh read. A second broken key
// of the same table keeps it broken until it is fixed too.
func TestMapWatcherBrokenPartitionRepaired(t *testing.T) {
	ctx := testCtx(t)
	c := sharedClient(t)
	w, err := c.WatchMap(ctx)
	require.NoError(t, err)
	defer w.Close()
	tm, err := c.CreateTable(ctx, "t", Layout{Partitions: 3, StripePages: 1}, []string{"a:1", "a:1", "b:1"})
	require.NoError(t, err)

	_, err = c.cli.Put(ctx, c.keys.part("t", 1), "junk")
	require.NoError(t, err)
	_, err = c.cli.Put(ctx, c.keys.part("t", 2), "junk")
	require.NoError(t, err)
	m, err := w.Sync(ctx)
	require.NoError(t, err)
	_, err = m.Table("t")
	require.ErrorIs(t, err, corrupt.ErrCorruption)

	// One key fixed: still broken (the other is junk), in the copy as in a fresh read.
	_, err = c.cli.Put(ctx, c.keys.part("t", 1), string(encodePartition("c:1")))
	require.NoError(t, err)
	m, err = w.Sync(ctx)
	require.NoError(t, err)
	_, err = m.Table("t")
	require.ErrorIs(t, err, corrupt.ErrCorruption)

	// Both fixed: the table is back, equal to what ReadMap sees.
	_, err = c.cli.Put(ctx, c.keys.part("t", 2), string(encodePartition("d:1")))
	require.NoError(t, err)
	m, err = w.Sync(ctx)
	require.NoError(t, err)
	fresh, err := c.ReadMap(ctx)
	require.NoError(t, err)
	want, err := fresh.Table("t")
	require.NoError(t, err)
	got, err := m.Table("t")
	require.NoError(t, err, "the watcher's copy still calls the repaired table broken")
	require.Equal(t, want, got)
	require.Equal(t, []string{"a:1", "c:1", "d:1"}, got.Nodes)
	require.Equal(t, tm.Created, got.Created)
	require.Empty(t, m.Broken)

	// A junk table key that is then deleted (with its partitions): nothing broken remains.
	_, err = c.cli.Put(ctx, c.keys.table("u"), "junk")
	require.NoError(t, err)
	_, err = c.cli.Put(ctx, c.keys.part("u", 0), "junk")
	require.NoError(t, err)
	_, err = c.cli.Delete(ctx, c.keys.part("u", 0))
	require.NoError(t, err)
	m, err = w.Sync(ctx)
	require.NoError(t, err)
	_, err = m.Table("u")
	require.ErrorIs(t, err, corrupt.ErrCorruption, "the table key is still junk")
	_, err = c.cli.Delete(ctx, c.keys.table("u"))
	require.NoError(t, err)
	m, err = w.Sync(ctx)
	require.NoError(t, err)
	require.Empty(t, m.Broken)
}

// A Release whose delete did not reach etcd leaves the owner key bound to the session's
// lease. The next Acquire must not hand out the released grant's epoch again (a write of the
// released grant still in flight would pass the storage node's fence under the new grant):
// it takes the partition with a new, higher epoch.
func TestOwnershipAcquireAfterFailedReleaseNewEpoch(t *testing.T) {
	ctx, c, s := sessionOfT(t)
	o := acquire(t, ctx, s, "t", 0)
	gone, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, o.Release(gone), ErrUnavailable)
	require.ErrorIs(t, o.Check(), ErrLost)
	h, ok, err := c.Owner(ctx, "t", 0)
	require.NoError(t, err)
	require.True(t, ok, "the failed release left the key")
	require.Equal(t, o.Epoch(), h.Epoch)

	o2 := acquire(t, ctx, s, "t", 0)
	require.Greater(t, o2.Epoch(), o.Epoch(), "a released grant's epoch came back")
	requireServing(t, o2)
	require.ErrorIs(t, o.Check(), ErrLost, "the released grant stays lost")
	h, ok, err = c.Owner(ctx, "t", 0)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, o2.Epoch(), h.Epoch)
}

// failGetKV fails every Get of key (etcd refusing or unreachable for that read).
type failGetKV struct {
	clientv3.KV
	key string
}

func (k failGetKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	if key == k.key {
		return nil, errors.New("injected: read refused")
	}
	return k.KV.Get(ctx, key, opts...)
}

// deadlineLease records the deadline of every Revoke's context.
type deadlineLease struct {
	clientv3.Lease
	revokes chan time.Time
}

func (l deadlineLease) Revoke(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseRevokeResponse, error) {
	d, _ := ctx.Deadline() // zero: no deadline
	l.revokes <- d
	return l.Lease.Revoke(ctx, id)
}

// NewSession failing after its grant revokes the lease best effort, but within the caller's
// context: "fails when etcd cannot be reached within ctx" must not turn into a wait of the
// whole TTL (up to an hour) when etcd stops answering.
func TestSessionNewFailureHonoursContext(t *testing.T) {
	c := sharedClient(t)
	c.cli.KV = failGetKV{KV: c.cli.KV, key: c.keys.ownPrefix()}
	revokes := make(chan time.Time, 1)
	c.cli.Lease = deadlineLease{Lease: c.cli.Lease, revokes: revokes}
	ctx, cancel := context.WithTimeout(testCtx(t), 30*time.Second)
	defer cancel()
	want, _ := ctx.Deadline()
	_, err := c.NewSession(ctx, SessionConfig{Owner: 1, TTL: TTLMax})
	require.ErrorIs(t, err, ErrUnavailable)
	select {
	case d := <-revokes:
		require.False(t, d.IsZero(), "a revoke without a deadline")
		require.False(t, d.After(want), "the revoke may wait until %v, past the caller's deadline %v", d, want)
	default:
		t.Fatal("the granted lease was not revoked")
	}
}

// hookTxnKV runs after, once armed, for the first transaction committed after arming,
// after etcd answered it and before its caller sees the answer; got (when set) hears of
// every Get answered.
type hookTxnKV struct {
	clientv3.KV
	after *func()
	got   chan struct{}
}

func (k hookTxnKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	resp, err := k.KV.Get(ctx, key, opts...)
	if k.got != nil {
		select {
		case k.got <- struct{}{}:
		default:
		}
	}
	return resp, err
}

func (k hookTxnKV) Txn(ctx context.Context) clientv3.Txn {
	return hookTxn{Txn: k.KV.Txn(ctx), after: k.after}
}

type hookTxn struct {
	clientv3.Txn
	after *func()
}

func (t hookTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	return hookTxn{Txn: t.Txn.If(cs...), after: t.after}
}
func (t hookTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	return hookTxn{Txn: t.Txn.Then(ops...), after: t.after}
}
func (t hookTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	return hookTxn{Txn: t.Txn.Else(ops...), after: t.after}
}
func (t hookTxn) Commit() (*clientv3.TxnResponse, error) {
	resp, err := t.Txn.Commit()
	if f := *t.after; f != nil {
		*t.after = nil
		f()
	}
	return resp, err
}

// A verify (after a lapse, or a compaction) that read the owner keys judges only the
// ownerships it read them for: a grant of the same partition made while its read was in
// flight (the earlier one released meanwhile) is not lost for a key read before it existed.
func TestOwnershipVerifyJudgesOnlyWhatItRead(t *testing.T) {
	ctx := testCtx(t)
	c := sharedClient(t)
	createTable(t, c, "t", 1)
	var after func()
	c.cli.KV = hookTxnKV{KV: c.cli.KV, after: &after}
	s := newSession(t, c, 1, nil)
	o1 := acquire(t, ctx, s, "t", 0)
	var o2 *Ownership
	after = func() { // verify's read is answered: o1's key, at o1's epoch
		require.NoError(t, o1.Release(ctx))
		o2 = acquire(t, ctx, s, "t", 0)
	}
	require.NoError(t, s.verify(ctx, false))
	require.NotNil(t, o2)
	require.Greater(t, o2.Epoch(), o1.Epoch())
	require.NoError(t, o2.Check(), "a live grant lost by a read made before it")
	h, ok, err := c.Owner(ctx, "t", 0)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, o2.Epoch(), h.Epoch)
}

// A switch names an existing partition entry: one beyond the table's partitions (with the
// revision 0 of a missing key) must change nothing, not write an entry that breaks the
// table for every reader.
func TestMapSwitchMissingPartitionChangesNothing(t *testing.T) {
	ctx := testCtx(t)
	c := sharedClient(t)
	tm, err := c.CreateTable(ctx, "t", Layout{Partitions: 2, StripePages: 1}, []string{"a:1", "b:1"})
	require.NoError(t, err)
	for _, rev := range []int64{0, -1} {
		_, err = c.SwitchPartition(ctx, "t", tm.Created, 2, rev, "c:1")
		require.ErrorIs(t, err, ErrInvalid, "rev %d", rev)
		_, err = c.SwitchPartition(ctx, "t", tm.Created, 1, rev, "c:1")
		require.ErrorIs(t, err, ErrInvalid, "rev %d", rev)
	}
	// A real revision of another partition, for one beyond the table: no entry has it.
	_, err = c.SwitchPartition(ctx, "t", tm.Created, 2, tm.Revs[1], "c:1")
	require.ErrorIs(t, err, ErrMapChanged)
	m, err := c.ReadMap(ctx)
	require.NoError(t, err)
	got, err := m.Table("t")
	require.NoError(t, err, "the table broke")
	require.Equal(t, tm, got)
}

// An owner key deleted (an operator, DropTable) right after an Acquire's grant, while the
// session's owner-key watch is cut off and etcd compacts the events away: the watch reads
// afresh, but the Acquire was still pending then (no epoch to verify), so the grant must be
// proven by the Acquire itself, not handed out on trust as a live ownership of a gone key.
func TestOwnershipAcquirePendingAcrossCompaction(t *testing.T) {
	ctx := testCtx(t)
	srv := etcdtest.Start(t)
	c := connect(t, "/weft/", srv.Endpoints()...)
	p := newProxy(t, srv.Addr())
	cp := connect(t, "/weft/", p.Endpoint())
	createTable(t, c, "t", 1)
	var after func()
	got := make(chan struct{}, 1)
	cp.cli.KV = hookTxnKV{KV: cp.cli.KV, after: &after, got: got}
	watched := make(chan int64, 64)
	s, err := cp.NewSession(ctx, SessionConfig{Owner: 1, hookWatched: func(rev int64) {
		select {
		case watched <- rev:
		default:
		}
	}})
	require.NoError(t, err)
	defer s.Close(ctx)
	after = func() { // the grant is made; the Acquire has not heard it yet
		p.Cut(true)
		_, err := c.cli.Delete(ctx, c.keys.owner("t", 0))
		require.NoError(t, err)
		pr, err := c.cli.Put(ctx, "/elsewhere", "x")
		require.NoError(t, err)
		_, err = c.cli.Compact(ctx, pr.Header.Revision)
		require.NoError(t, err)
		select {
		case <-got: // drain
		default:
		}
		p.Cut(false)
		// The watch, compacted, reads afresh (a Get through cp), then watches from after
		// that read: it is past the compaction once it delivers an owner-prefix event
		// written after the read.
		select {
		case <-got:
		case <-ctx.Done():
			t.Error("the owner-key watch never read afresh")
			return
		}
		mr, err := c.cli.Put(ctx, c.keys.ownPrefix()+"marker", "x")
		require.NoError(t, err)
		for {
			select {
			case rev := <-watched:
				if rev >= mr.Header.Revision {
					return
				}
			case <-ctx.Done():
				t.Error("the owner-key watch never got past the compaction")
				return
			}
		}
	}
	o, err := s.Acquire(ctx, "t", 0)
	if err == nil {
		err = o.Check()
	}
	require.ErrorIs(t, err, ErrLost, "an ownership of a deleted owner key is vouched for")
	_, ok, err := c.Owner(ctx, "t", 0)
	require.NoError(t, err)
	require.False(t, ok)
}

// Sync on a closed watcher fails and leaves nothing running: a progress request for a watch
// context with no open watch would open an etcd watch stream that outlives the watcher
// (until the client closes).
func TestMapWatcherSyncAfterCloseLeaksNothing(t *testing.T) {
	ctx := testCtx(t)
	c := sharedClient(t)
	before := goleak.IgnoreCurrent()
	w, err := c.WatchMap(ctx)
	require.NoError(t, err)
	w.Close()
	// etcd's revision moves past the copy's: Sync has to wait for the watch.
	_, err = c.cli.Put(ctx, newPrefix(t)+"unrelated", "x")
	require.NoError(t, err)
	_, err = w.Sync(ctx)
	require.Error(t, err)
	// The embedded etcd server ends its side of the closed watch stream on its own time
	// (seconds under -race on two busy cores; goleak.Find gives up after about 0.4 s): the
	// check is repeated, bounded, and a stream Sync opened would never end.
	deadline := time.Now().Add(10 * time.Second)
	for err = goleak.Find(before); err != nil && time.Now().Before(deadline); err = goleak.Find(before) {
	}
	require.NoError(t, err)
}

// Clusters share one etcd under different prefixes only if neither's keys fall under the
// other's: a prefix inside another's map or owner space ("/a/own/x/" under "/a/") would have
// "/a/"'s DropTable("x") delete every key of it, and "/a/"'s map show phantom tables.
func TestPrefixNotInsideAnotherClustersKeys(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix(t)
	outer := connect(t, prefix, sharedEtcd(t).Endpoints()...)
	for _, p := range []string{prefix + "own/x/", prefix + "map/t/x/", prefix + "map/", "own/", "map/x/"} {
		_, err := NewClient(outer.cli, p, nil)
		require.ErrorIs(t, err, ErrInvalid, "prefix %q", p)
		_, err = Connect(ctx, Config{Endpoints: sharedEtcd(t).Endpoints(), Prefix: p})
		require.ErrorIs(t, err, ErrInvalid, "prefix %q", p)
	}
	inner, err := NewClient(outer.cli, prefix+"b/", nil) // a sibling space: fine
	require.NoError(t, err)
	_, err = outer.CreateTable(ctx, "b", Layout{Partitions: 1, StripePages: 1}, []string{"s:1"})
	require.NoError(t, err)
	_, err = inner.CreateTable(ctx, "t", Layout{Partitions: 1, StripePages: 1}, []string{"s:1"})
	require.NoError(t, err)
	require.NoError(t, outer.DropTable(ctx, "b"))
	m, err := inner.ReadMap(ctx)
	require.NoError(t, err)
	_, err = m.Table("t")
	require.NoError(t, err)
}
