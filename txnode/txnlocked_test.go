package txnode

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/storenode/server"
)

// deadLeases is a storenode.LeaseChecker: every lease is alive until killed.
type deadLeases struct {
	mu   sync.Mutex
	dead map[int64]bool
}

func (l *deadLeases) LeaseAlive(ctx context.Context, lease int64) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.dead[lease], ctx.Err()
}

func (l *deadLeases) kill(lease int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dead[lease] = true
}

// A cluster table whose partition has a transaction in doubt (prepared by a coordinator
// whose etcd lease then expired) is not granted until the storage node's resolver settles
// it: the transaction node's open waits, asking again on its timer (no spinning), and
// registers its grant once the resolver aborted the transaction; the prepared row never
// appears. A context that ends first ends the wait with its error and releases the grant.
// Fails on 964dade: the open returned ErrTxnLocked at once.
func TestClusterOpenWaitsForTxnInDoubt(t *testing.T) {
	ctx := context.Background()
	const coord, owner = 0x41, 0x42
	const lease = 7
	g := &memGrants{keys: map[string][2]uint64{}, owner: coord, rev: 10}
	leases := &deadLeases{dead: map[int64]bool{}}
	e, err := storenode.Open(storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone, GrantVerifier: g,
		LeaseChecker: leases, TxnResolveInterval: -1, TxnResolveAfter: time.Nanosecond})
	require.NoError(t, err)
	defer e.Close()
	srv, err := server.New(server.Config{Listen: "127.0.0.1:0", Engine: e})
	require.NoError(t, err)
	require.NoError(t, srv.Start())
	defer srv.Shutdown(ctx)
	name := base.PartitionTableName("acct", 0)
	ti, err := e.CreateClusterTable(name, 64, base.ClusterLayout{Partitions: 1, StripePages: 1})
	require.NoError(t, err)

	// The coordinator registers its grant and prepares a row, then dies: its etcd grant and
	// its lease are gone.
	epoch, _, releaseCoord, err := g.Grant(ctx, "acct", 0)
	require.NoError(t, err)
	_, err = e.RegisterGrant(ctx, ti.ID, coord, epoch)
	require.NoError(t, err)
	first, _, err := e.AllocIDs(ti.ID, coord, epoch, 1)
	require.NoError(t, err)
	prepared := row(99)
	txn := base.TxnID{0: 0x7e, 15: 1}
	_, err = e.PrepareTxn(&base.TxnPrepare{Txn: txn, Lease: lease, Batch: &base.Batch{Owner: coord, Seq: 1,
		Fences:   []base.Fence{{Table: ti.ID, Epoch: epoch}},
		Segments: []base.Segment{{Table: ti.ID, Page: first / 64, Data: 1 << (first % 64), Rows: prepared}}}})
	require.NoError(t, err)
	require.NoError(t, releaseCoord(ctx))
	leases.kill(lease)
	g.mu.Lock()
	g.owner = owner
	g.mu.Unlock()

	type timer struct {
		d    time.Duration
		fire chan time.Time
	}
	timers := make(chan timer, 16)
	lockedTimer := func(d time.Duration) (<-chan time.Time, func() bool) {
		tm := timer{d: d, fire: make(chan time.Time, 1)}
		timers <- tm
		return tm.fire, func() bool { return true }
	}
	nextTimer := func() timer {
		t.Helper()
		return recvWithin(t, timers, "a wait for the transaction in doubt")
	}

	// A context that ends while the transaction is in doubt ends the wait; the grant goes.
	db1 := openDB(t, ctx, Options{StoreAddr: srv.Addr().String(), OwnerID: owner, grants: g, lockedTimer: lockedTimer})
	cctx, cancel := context.WithCancel(ctx)
	opened := make(chan error, 1)
	go func() {
		_, err := db1.Table(cctx, name)
		opened <- err
	}()
	nextTimer()
	cancel()
	err = recvWithin(t, opened, "the cancelled open")
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, storenode.ErrTxnLocked)
	require.EqualValues(t, 2, g.releases.Load(), "the coordinator's, and the waiting open's grant")
	// Close while an open waits: the wait ends with ErrClosed, the grant goes, Close returns.
	go func() {
		_, err := db1.Table(ctx, name)
		opened <- err
	}()
	nextTimer()
	require.NoError(t, db1.Close(ctx))
	err = recvWithin(t, opened, "the open waiting through Close")
	require.ErrorIs(t, err, ErrClosed)
	require.EqualValues(t, 3, g.releases.Load(), "the grant of the open that Close ended")

	db := openDB(t, ctx, Options{StoreAddr: srv.Addr().String(), OwnerID: owner, grants: g, lockedTimer: lockedTimer})
	defer db.Close(ctx)
	type result struct {
		tb  *Table
		err error
	}
	done := make(chan result, 1)
	go func() {
		tb, err := db.Table(ctx, name)
		done <- result{tb, err}
	}()
	// Refused while in doubt, twice, with a growing wait: it waits, it does not spin.
	tm1 := nextTimer()
	tm1.fire <- time.Time{}
	tm2 := nextTimer()
	require.Greater(t, tm2.d, tm1.d, "backoff")
	select {
	case r := <-done:
		t.Fatalf("the open ended while the transaction was in doubt: %v", r.err)
	default:
	}

	// The resolver settles it (the coordinator's lease is gone: abort); the next try
	// registers.
	require.NoError(t, e.ResolveTxns(ctx))
	require.Equal(t, storenode.TxnStatus{Primary: base.DecisionAbort}, e.TxnStatus(txn), "aborted (the part reported; the primary keeps the abort)")
	tm2.fire <- time.Time{}
	r := recvWithin(t, done, "the open after the resolution")
	require.NoError(t, r.err)
	dst := make([]byte, 64)
	require.ErrorIs(t, r.tb.Get(ctx, first, dst), ErrNotFound, "the aborted prepared row never appears")
	id := insertRow(t, ctx, r.tb, row(5))
	require.NoError(t, r.tb.Get(ctx, id, dst))
	require.Equal(t, row(5), dst)
}
