package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weftdb/weft/cluster/etcdtest"
	"github.com/weftdb/weft/internal/testkit"
)

// testTTL is the shortest lease etcd grants on its default timing: for the tests that wait
// for leases to expire. The others use TTLDefault, so a loaded machine's stall of a
// keepalive does not lapse their sessions.
const testTTL = 2 * time.Second

func newSession(t *testing.T, c *Client, owner uint64, clock Clock) *Session {
	return newSessionTTL(t, c, owner, clock, TTLDefault)
}

func newSessionTTL(t *testing.T, c *Client, owner uint64, clock Clock, ttl time.Duration) *Session {
	t.Helper()
	s, err := c.NewSession(testCtx(t), SessionConfig{Owner: owner, Addr: fmt.Sprintf("node%d:1", owner), TTL: ttl, Clock: clock})
	require.NoError(t, err)
	testkit.CloseAtCleanup(t, 5*time.Second, s.Close)
	return s
}

func createTable(t *testing.T, c *Client, name string, parts uint32) *TableMap {
	t.Helper()
	nodes := make([]string, parts)
	for i := range nodes {
		nodes[i] = "store:1"
	}
	tm, err := c.CreateTable(testCtx(t), name, Layout{Partitions: parts, StripePages: 1}, nodes)
	require.NoError(t, err)
	return tm
}

// sessionOfT returns the test's context, the shared client with a table "t" of one partition
// created, and a session of owner 1 (the real clock).
func sessionOfT(t *testing.T) (context.Context, *Client, *Session) {
	t.Helper()
	c := sharedClient(t)
	createTable(t, c, "t", 1)
	return testCtx(t), c, newSession(t, c, 1, nil)
}

// Sessions race for one partition, round after round: exactly one wins each round, the
// others learn who; every grant's epoch is above the last.
func TestOwnershipRace(t *testing.T) {
	ctx := testCtx(t)
	c := sharedClient(t)
	createTable(t, c, "t", 2)
	racers, rounds := 5, 6
	if testing.Short() {
		racers, rounds = 3, 3
	}
	ss := make([]*Session, racers)
	for i := range ss {
		ss[i] = newSession(t, c, uint64(i+1), nil)
	}
	var last uint64
	for r := 0; r < rounds; r++ {
		type res struct {
			i   int
			o   *Ownership
			err error
		}
		ch := make(chan res, racers)
		for i, s := range ss {
			go func() {
				o, err := s.Acquire(ctx, "t", 1)
				ch <- res{i, o, err}
			}()
		}
		var win *Ownership
		var losers []error
		for range ss {
			x := <-ch
			if x.err == nil {
				require.Nil(t, win, "round %d: two owners", r)
				win = x.o
				continue
			}
			losers = append(losers, x.err)
		}
		require.NotNil(t, win, "round %d: no owner", r)
		requireServing(t, win)
		require.Greater(t, win.Epoch(), last)
		last = win.Epoch()
		for _, err := range losers {
			var oe *OwnedError
			require.ErrorAs(t, err, &oe)
			require.ErrorIs(t, err, ErrOwned)
			require.Equal(t, win.Session().Holder().Owner, oe.Holder.Owner)
			require.Equal(t, win.Session().Holder().Addr, oe.Holder.Addr)
			require.Equal(t, win.Epoch(), oe.Holder.Epoch)
		}
		h, ok, err := c.Owner(ctx, "t", 1)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, win.Epoch(), h.Epoch)
		require.Equal(t, win.Session().Holder().Incarnation, h.Incarnation)
		// Acquire again by the winner: the same grant.
		again, err := win.Session().Acquire(ctx, "t", 1)
		require.NoError(t, err)
		require.Same(t, win, again)
		require.NoError(t, win.Release(ctx))
		require.ErrorIs(t, win.Check(), ErrLost)
		_, ok, err = c.Owner(ctx, "t", 1)
		require.NoError(t, err)
		require.False(t, ok, "released")
		select {
		case <-win.Done():
		default:
			t.Fatal("a released ownership's Done is not closed")
		}
	}
}

func TestOwnershipMissingPartition(t *testing.T) {
	ctx := testCtx(t)
	c := sharedClient(t)
	createTable(t, c, "t", 2)
	s := newSession(t, c, 1, nil)
	_, err := s.Acquire(ctx, "t", 2)
	require.ErrorIs(t, err, ErrTableNotFound)
	_, err = s.Acquire(ctx, "nope", 0)
	require.ErrorIs(t, err, ErrTableNotFound)
}

// Close revokes the lease: another node takes the partition at once, with a higher epoch,
// and the closed session's ownership is lost.
func TestOwnershipCloseHandsOver(t *testing.T) {
	ctx := testCtx(t)
	c := sharedClient(t)
	createTable(t, c, "t", 1)
	a, b := newSession(t, c, 1, nil), newSession(t, c, 2, nil)
	oa := acquire(t, ctx, a, "t", 0)
	_, err := b.Acquire(ctx, "t", 0)
	require.ErrorIs(t, err, ErrOwned)
	require.NoError(t, a.Close(ctx))
	require.ErrorIs(t, oa.Check(), ErrSessionClosed)
	require.ErrorIs(t, a.Check(), ErrSessionClosed)
	_, err = a.Acquire(ctx, "t", 0)
	require.ErrorIs(t, err, ErrSessionClosed)
	ob := acquire(t, ctx, b, "t", 0)
	require.Greater(t, ob.Epoch(), oa.Epoch())
}

// Dropping the table deletes its owner keys: the owner hears of it through its watch.
func TestOwnershipLostWithDrop(t *testing.T) {
	ctx, c, s := sessionOfT(t)
	o := acquire(t, ctx, s, "t", 0)
	require.NoError(t, c.DropTable(ctx, "t"))
	select {
	case <-o.Done():
	case <-ctx.Done():
		t.Fatal("the drop was not seen")
	}
	require.ErrorIs(t, o.Check(), ErrLost)
	require.NoError(t, s.Check(), "the session itself goes on")
}

// A node cut off from etcd: its keepalives stop, its deadline passes before etcd expires its
// lease, so before another node is granted the partition (with a strictly higher epoch);
// once back, it learns its lease is gone and the ownership is lost for good.
func TestOwnershipLeaseExpiryHandsOver(t *testing.T) {
	ctx := testCtx(t)
	c, ca, p := proxiedClients(t)
	rounds := 2
	if testing.Short() {
		rounds = 1
	}
	createTable(t, c, "t", 1)
	b := newSession(t, c, 2, nil) // its lease need not expire: the default TTL rides out a stall
	var last uint64
	for r := 0; r < rounds; r++ {
		p.Cut(false)
		a := newSessionTTL(t, ca, 1, nil, testTTL)
		oa, err := a.AcquireWait(ctx, "t", 0) // the previous round's owner may still hold it
		require.NoError(t, err)
		require.Greater(t, oa.Epoch(), last)
		p.Cut(true)
		ob, err := b.AcquireWait(ctx, "t", 0)
		require.NoError(t, err)
		granted := time.Now()
		require.Greater(t, ob.Epoch(), oa.Epoch())
		last = ob.Epoch()
		// The cut-off owner stopped vouching before the grant.
		require.ErrorIs(t, oa.Check(), ErrLapsed)
		require.True(t, oa.Deadline().Before(granted), "deadline %v, granted %v", oa.Deadline(), granted)
		// Back on the network: the lease is gone in etcd, so the ownership is lost.
		p.Cut(false)
		select {
		case <-oa.Done():
		case <-ctx.Done():
			t.Fatal("the cut-off owner never learnt its lease expired")
		}
		require.ErrorIs(t, oa.Check(), ErrLost)
		require.ErrorIs(t, a.WaitServing(ctx), ErrLost)
		require.NoError(t, ob.Release(ctx))
	}
}

// The deadline counts from when a keepalive was sent, not when it was answered: a keepalive
// answered an hour later (on the session's clock) proves nothing past its start plus TTL.
func TestOwnershipDeadlineFromKeepaliveStart(t *testing.T) {
	ctx := testCtx(t)
	c := sharedClient(t)
	clock := newFakeClock()
	hooked := make(chan struct{})
	renewed := make(chan struct{}, 1)
	first := true
	s, err := c.NewSession(ctx, SessionConfig{Owner: 1, TTL: testTTL, Clock: clock,
		hookKeepAlive: func() {
			if first {
				first = false
				clock.advance(time.Hour)
				close(hooked)
			}
		},
		hookRenewed: func() {
			select {
			case renewed <- struct{}{}:
			default:
			}
		}})
	require.NoError(t, err)
	defer s.Close(ctx)
	d0 := s.Deadline()
	require.Equal(t, clock.Now().Add(s.TTL()-s.TTL()/4), d0, "grant: start + TTL - margin")
	select {
	case <-hooked:
	case <-ctx.Done():
		t.Fatal("no keepalive")
	}
	// Drain a signal sent before the hooked renewal finished, then wait for one after.
	select {
	case <-renewed:
	case <-ctx.Done():
		t.Fatal("no renewal")
	}
	require.ErrorIs(t, s.Check(), ErrLapsed, "a keepalive answered after the deadline is no proof for now")
	require.Equal(t, d0, s.Deadline())
	// Later keepalives start after the jump: serving again, the deadline an hour on.
	require.NoError(t, s.WaitServing(ctx))
	require.Equal(t, clock.Now().Add(s.TTL()-s.TTL()/4), s.Deadline())
}

// etcd restarted under a live owner: while it is down the owner's deadline passes and it
// vouches for nothing (nor acquires); once etcd is back (which renews every lease) a
// keepalive and a read of its owner keys prove the grant again, with the same epoch, still
// exclusive.
func TestOwnershipEtcdRestart(t *testing.T) {
	ctx := testCtx(t)
	srv := etcdtest.Start(t)
	c := connect(t, "/weft/", srv.Endpoints()...)
	createTable(t, c, "t", 2)
	clock := newFakeClock()
	s := newSession(t, c, 1, clock)
	o := acquire(t, ctx, s, "t", 0)
	w, err := c.WatchMap(ctx)
	require.NoError(t, err)
	defer w.Close()

	srv.Stop()
	clock.advance(s.TTL())
	require.ErrorIs(t, o.Check(), ErrLapsed)
	_, err = s.Acquire(ctx, "t", 1)
	require.ErrorIs(t, err, ErrLapsed)
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = c.ReadMap(short)
	cancel()
	require.ErrorIs(t, err, ErrUnavailable)
	_, err = w.Map().Table("t")
	require.NoError(t, err, "the local copy of the map stays")

	require.NoError(t, srv.Restart())
	requireServing(t, o)
	other := newSession(t, c, 2, nil)
	_, err = other.Acquire(ctx, "t", 0)
	require.ErrorIs(t, err, ErrOwned)
	o1 := acquire(t, ctx, s, "t", 1)
	require.Greater(t, o1.Epoch(), o.Epoch())
	_, err = w.Sync(ctx)
	require.NoError(t, err)
}

// A lapsed session whose owner key was deleted meanwhile never vouches for it again: by the
// time it serves again, the ownership is lost. The read of its keys after the lapse decides,
// not the watch: the watch is held up here until the end.
func TestOwnershipLapseVerifiesKeys(t *testing.T) {
	ctx := testCtx(t)
	c, ca, p := proxiedClients(t)
	createTable(t, c, "t", 2)
	// More owner keys than one etcd transaction reads (the proof reads them in batches).
	createTable(t, c, "u", 127)
	clock := newFakeClock()
	var held atomic.Bool
	release := make(chan struct{})
	var releaseOnce sync.Once
	unhold := func() { releaseOnce.Do(func() { close(release) }) }
	s, err := ca.NewSession(ctx, SessionConfig{Owner: 1, Clock: clock, hookWatch: func() {
		if held.Load() {
			<-release
		}
	}})
	require.NoError(t, err)
	defer s.Close(ctx)
	defer unhold()
	o0 := acquire(t, ctx, s, "t", 0)
	o1 := acquire(t, ctx, s, "t", 1)
	us := make([]*Ownership, 127)
	for p := range us {
		us[p], err = s.Acquire(ctx, "u", uint32(p))
		require.NoError(t, err)
	}
	held.Store(true)
	p.Cut(true)
	_, err = c.cli.Delete(ctx, c.keys.owner("t", 0)) // an operator's delete while s is cut off
	require.NoError(t, err)
	_, err = c.cli.Delete(ctx, c.keys.owner("u", 126))
	require.NoError(t, err)
	clock.advance(s.TTL())
	require.ErrorIs(t, o0.Check(), ErrLapsed)
	p.Cut(false)
	require.NoError(t, s.WaitServing(ctx))
	require.ErrorIs(t, o0.Check(), ErrLost, "vouched for a key it had not read since the lapse")
	require.ErrorIs(t, us[126].Check(), ErrLost, "vouched for a key it had not read since the lapse")
	require.NoError(t, o1.Check())
	for _, o := range us[:126] {
		require.NoError(t, o.Check())
	}
	unhold()
}

// A watch running behind delivers an earlier grant's put and release after a new grant of
// the same partition to the same session: the new grant stands.
func TestOwnershipStaleEventsOfEarlierGrant(t *testing.T) {
	ctx := testCtx(t)
	c := sharedClient(t)
	createTable(t, c, "t", 1)
	var held atomic.Bool
	release := make(chan struct{})
	var releaseOnce sync.Once
	unhold := func() { releaseOnce.Do(func() { close(release) }) }
	var handled atomic.Int64
	progress := make(chan struct{}, 1)
	s, err := c.NewSession(ctx, SessionConfig{Owner: 1,
		hookWatch: func() {
			if held.Load() {
				<-release
			}
		},
		hookWatched: func(rev int64) {
			handled.Store(rev)
			select {
			case progress <- struct{}{}:
			default:
			}
		}})
	require.NoError(t, err)
	defer s.Close(ctx)
	defer unhold()
	held.Store(true)
	o1 := acquire(t, ctx, s, "t", 0)
	require.NoError(t, o1.Release(ctx))
	o2 := acquire(t, ctx, s, "t", 0)
	require.Greater(t, o2.Epoch(), o1.Epoch())
	unhold()
	for handled.Load() < int64(o2.Epoch()) {
		select {
		case <-progress:
		case <-ctx.Done():
			t.Fatal("the watch never caught up")
		}
	}
	require.NoError(t, o2.Check(), "lost to the events of the grant before it")
}

// requireServing waits until o's session serves, then requires o to.
func requireServing(t *testing.T, o *Ownership) {
	t.Helper()
	require.NoError(t, o.Session().WaitServing(testCtx(t)))
	require.NoError(t, o.Check())
}

func TestSessionConfigBounds(t *testing.T) {
	ctx := testCtx(t)
	c := sharedClient(t)
	for _, cfg := range []SessionConfig{
		{Owner: 0},
		{Owner: 1, TTL: time.Second},
		{Owner: 1, TTL: 2500 * time.Millisecond},
		{Owner: 1, TTL: 2 * time.Second, Margin: 1500 * time.Millisecond},
		{Owner: 1, Addr: string(make([]byte, 256))},
	} {
		_, err := c.NewSession(ctx, cfg)
		require.ErrorIs(t, err, ErrInvalid, "%+v", cfg)
	}
}

func TestOwnershipCheckAllocs(t *testing.T) {
	ctx, _, s := sessionOfT(t)
	o := acquire(t, ctx, s, "t", 0)
	var bad error
	allocs := testing.AllocsPerRun(100, func() {
		if err := o.Check(); err != nil {
			bad = err
		}
	})
	if bad != nil && !errors.Is(bad, ErrLapsed) {
		t.Fatal(bad)
	}
	if bad == nil {
		require.Zero(t, allocs)
	}
}

// An Acquire whose reply was lost left the key in etcd, bound to the session's lease: the
// next Acquire adopts it with its epoch, and another session cannot take it.
func TestOwnershipAcquireAdoptsOwnKey(t *testing.T) {
	ctx, c, s := sessionOfT(t)
	put, err := c.cli.Put(ctx, c.keys.owner("t", 0), string(encodeOwner(s.Holder())), clientv3.WithLease(clientv3.LeaseID(s.Lease())))
	require.NoError(t, err)
	_, err = newSession(t, c, 2, nil).Acquire(ctx, "t", 0)
	require.ErrorIs(t, err, ErrOwned)
	o := acquire(t, ctx, s, "t", 0)
	require.Equal(t, uint64(put.Header.Revision), o.Epoch())
	requireServing(t, o)
}

// Close while Acquires run: afterwards no ownership of the session vouches and no owner key
// of its lease is left in etcd (the revoke took those granted before it; those after it
// failed).
func TestSessionCloseDuringAcquires(t *testing.T) {
	ctx := testCtx(t)
	c := sharedClient(t)
	parts := 64
	if testing.Short() {
		parts = 24
	}
	createTable(t, c, "t", uint32(parts))
	s, err := c.NewSession(ctx, SessionConfig{Owner: 1})
	require.NoError(t, err)
	var wg sync.WaitGroup
	owned := make([]*Ownership, parts)
	started := make(chan struct{})
	for p := 0; p < parts; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if p == parts/2 {
				close(started)
			}
			owned[p], _ = s.Acquire(ctx, "t", uint32(p))
		}()
	}
	<-started
	require.NoError(t, s.Close(ctx))
	wg.Wait()
	for _, o := range owned {
		if o != nil {
			require.ErrorIs(t, o.Check(), ErrSessionClosed)
		}
	}
	resp, err := c.cli.Get(ctx, c.keys.ownPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	require.Zero(t, resp.Count, "owner keys outlived their session")
}

func TestLeaseAlive(t *testing.T) {
	ctx := testCtx(t)
	c := sharedClient(t)
	s := newSession(t, c, 1, nil)
	alive, err := c.LeaseAlive(ctx, s.Lease())
	require.NoError(t, err)
	require.True(t, alive)
	require.NoError(t, s.Close(ctx))
	alive, err = c.LeaseAlive(ctx, s.Lease())
	require.NoError(t, err)
	require.False(t, alive)
	alive, err = c.LeaseAlive(ctx, 12345)
	require.NoError(t, err)
	require.False(t, alive)
}

// An Acquire under a lease etcd no longer has (expired or revoked before the keepalive
// goroutine heard of it) ends the session: ErrLost, not an unavailable etcd.
func TestOwnershipAcquireUnderGoneLease(t *testing.T) {
	ctx, c, s := sessionOfT(t)
	_, err := c.cli.Revoke(ctx, clientv3.LeaseID(s.Lease()))
	require.NoError(t, err)
	_, err = s.Acquire(ctx, "t", 0)
	require.ErrorIs(t, err, ErrLost)
	require.NotErrorIs(t, err, ErrUnavailable)
	select {
	case <-s.Done():
	default:
		t.Fatal("the session goes on under a gone lease")
	}
}
