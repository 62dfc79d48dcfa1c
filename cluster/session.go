package cluster

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weftdb/weft/cluster/internal/testhook"
)

// Sessions and their deadline. A Session is one etcd lease of one node: every partition the
// node owns is an owner key bound to it, so one keepalive renews them all and one expiry (or
// Close: a revoke) frees them all at once.
//
// Invariants:
//   - deadline (nanoseconds after origin on the session's Clock) is the start of the last
//     keepalive that etcd answered with the lease alive (or of the grant), plus the TTL
//     etcd gave, minus the margin. etcd cannot expire the lease before that start plus the
//     TTL (it restarts the TTL when the keepalive arrives, which is later), so while the
//     Clock reads before the deadline, the lease is alive: no other session can hold a key
//     this one holds, unless someone deletes it outright (DropTable, an operator), which the
//     owner-key watch reports and the storage nodes' fences stop meanwhile.
//   - The deadline only moves forward, and only on a proof: a keepalive that started after
//     the deadline had passed moves it only once a linearizable read found every owner key
//     still created at its epoch and bound to this lease (verify), so a session that could
//     not talk to etcd never resumes on trust.
//   - Once the lease is gone (etcd answers "not found"), or the session is closed, every
//     ownership is lost for good; a lost ownership never comes back (acquire again: a new
//     grant, a new epoch).

// Session bounds.
const (
	// TTLMin is the shortest lease TTL: etcd refuses shorter ones on its default timing
	// (1.5 election timeouts, rounded up to seconds).
	TTLMin = 2 * time.Second
	// TTLMax bounds a lease TTL.
	TTLMax = time.Hour
	// TTLDefault is the lease TTL when SessionConfig.TTL is zero.
	TTLDefault = 10 * time.Second
)

// SessionConfig describes a node's session.
type SessionConfig struct {
	// Owner is the node's owner id (txnode.Options.OwnerID), nonzero.
	Owner uint64
	// Incarnation is the node's random instance id; a random one when zero.
	Incarnation [16]byte
	// Addr is where the node takes requests for the partitions it owns, written in its
	// owner keys (at most 255 bytes; may be empty).
	Addr string
	// WriteBack is set for a node that acknowledges writes before they are durable
	// (txnode WriteBack), written in its owner keys: a move asks it to flush first.
	WriteBack bool
	// TTL is the lease TTL asked of etcd, a whole number of seconds, TTLMin..TTLMax
	// (TTLDefault when zero). etcd may grant a longer one; the session uses what it grants.
	TTL time.Duration
	// Margin is how long before the lease could expire the session stops vouching for its
	// ownerships: it covers the rate difference of this node's clock and etcd leader's, and
	// the time from a Check to the end of the work it allowed. TTL/4 when zero; at most
	// TTL/2.
	Margin time.Duration
	// Clock is the deadline's clock (the system's monotonic clock when nil).
	Clock Clock

	// MoveFlush, when set, is called when a move asks for a flush of a partition this
	// session holds (epoch: the asking mover's epoch), or ends its request (epoch 0); on
	// the owner-key watch's goroutine, under the session's lock: it must not block or call
	// the session (cluster/node starts the flush on a goroutine of its own). moveflush.go.
	MoveFlush func(o *Ownership, epoch int64)

	// hookKeepAlive and hookRenewed, set by internal tests, run in the keepalive goroutine
	// after a keepalive returned (before the deadline moves) and after a renewal ended;
	// hookWatch runs in the owner-key watch goroutine before it handles a response, and
	// hookWatched after, with the revision it has handled through.
	hookKeepAlive, hookRenewed, hookWatch func()
	hookWatched                           func(rev int64)
}

// Session is a node's etcd lease, under which it owns partitions. Its methods may be called
// from any goroutine.
type Session struct {
	c      *Client
	lease  clientv3.LeaseID
	ttl    time.Duration // as granted
	margin time.Duration
	clock  Clock
	origin time.Time
	holder Holder // Epoch unused
	// moveFlush is SessionConfig.MoveFlush.
	moveFlush func(o *Ownership, epoch int64)

	// deadline is nanoseconds after origin; the session vouches strictly before it.
	deadline atomic.Int64
	ended    atomic.Bool // set once endErr is, before the ownerships are lost
	endErr   error

	mu      sync.Mutex
	owned   map[string]*Ownership // by owner key; pending ones have epoch 0
	changed chan struct{}         // closed and replaced on every deadline or state change
	// retired holds, by owner key, the epoch of a grant this session released whose
	// delete may not have reached etcd: Acquire never adopts a key of that epoch (it
	// deletes it and creates the key anew, with a new epoch). At most one per key.
	retired map[string]int64

	cancel context.CancelFunc
	wg     sync.WaitGroup
	closed chan struct{} // closed once the session ended (lease gone, or Close)

	hookKeepAlive, hookRenewed, hookWatch func() // SessionConfig's
	hookWatched                           func(rev int64)
}

// NewSession grants a lease and starts keeping it alive. It fails with ErrUnavailable when
// etcd cannot be reached within ctx.
func (c *Client) NewSession(ctx context.Context, cfg SessionConfig) (*Session, error) {
	if cfg.Owner == 0 {
		return nil, fmt.Errorf("%w: owner id 0", ErrInvalid)
	}
	if err := validAddr(cfg.Addr, true); err != nil {
		return nil, err
	}
	ttl := cfg.TTL
	if ttl == 0 {
		ttl = TTLDefault
	}
	if ttl < TTLMin || ttl > TTLMax || ttl%time.Second != 0 {
		return nil, fmt.Errorf("%w: lease TTL %v (whole seconds, %v..%v)", ErrInvalid, ttl, TTLMin, TTLMax)
	}
	if cfg.Margin < 0 || cfg.Margin > ttl/2 {
		return nil, fmt.Errorf("%w: margin %v (0..TTL/2)", ErrInvalid, cfg.Margin)
	}
	if cfg.Incarnation == ([16]byte{}) {
		rand.Read(cfg.Incarnation[:])
	}
	clock := cfg.Clock
	if clock == nil {
		clock = c.clock
	}
	origin := clock.Now()
	resp, err := c.cli.Grant(ctx, int64(ttl/time.Second))
	if err != nil {
		return nil, unavailable("grant a lease", err)
	}
	granted := time.Duration(resp.TTL) * time.Second
	margin := cfg.Margin
	if margin == 0 {
		margin = granted / 4
	}
	s := &Session{
		c: c, lease: resp.ID, ttl: granted, margin: margin, clock: clock, origin: origin,
		holder:    Holder{Owner: cfg.Owner, Incarnation: cfg.Incarnation, Addr: cfg.Addr, WriteBack: cfg.WriteBack},
		moveFlush: cfg.MoveFlush,
		owned:     make(map[string]*Ownership),
		retired:   make(map[string]int64),
		changed:   make(chan struct{}),
		closed:    make(chan struct{}),

		hookKeepAlive: cfg.hookKeepAlive, hookRenewed: cfg.hookRenewed, hookWatch: cfg.hookWatch,
		hookWatched: cfg.hookWatched,
	}
	s.deadline.Store(int64(granted - margin))
	// The owner-key watch starts at the revision of a read made after the grant: every key
	// this session will create is later.
	gr, err := c.cli.Get(ctx, c.keys.ownPrefix(), clientv3.WithCountOnly())
	if err != nil {
		// Best effort, within ctx (the caller bounded the whole call with it): the lease
		// holds no key yet and expires within the TTL anyway.
		rctx, cancel := context.WithTimeout(ctx, granted)
		c.cli.Revoke(rctx, resp.ID)
		cancel()
		return nil, unavailable("start a session", err)
	}
	bg, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.wg.Add(2)
	go s.keepAlive(bg)
	go s.watchOwners(bg, gr.Header.Revision)
	return s, nil
}

// Lease returns the session's etcd lease id.
func (s *Session) Lease() int64 { return int64(s.lease) }

// TTL returns the lease TTL etcd granted.
func (s *Session) TTL() time.Duration { return s.ttl }

// Holder returns what the session writes in its owner keys (Epoch zero).
func (s *Session) Holder() Holder { return s.holder }

// Deadline returns when the session stops vouching for its ownerships unless a keepalive
// moves it: the last proven keepalive's start plus TTL minus margin, on the session's Clock.
func (s *Session) Deadline() time.Time { return s.origin.Add(time.Duration(s.deadline.Load())) }

// Done is closed once the session ended: closed, or its lease gone.
func (s *Session) Done() <-chan struct{} { return s.closed }

// Check returns nil while the session vouches for its ownerships: ErrLapsed after its
// deadline (until a proven keepalive), ErrLost once its lease is gone, ErrSessionClosed after
// Close. Lock-free, no allocation on success; any goroutine.
func (s *Session) Check() error {
	if s.ended.Load() {
		return s.endErr
	}
	if now := s.clock.Now().Sub(s.origin); int64(now) >= s.deadline.Load() {
		return fmt.Errorf("%w: deadline %v passed", ErrLapsed, s.Deadline())
	}
	return nil
}

// WaitServing waits until Check returns nil (a lapsed session proved its lease again), or
// returns Check's error once the session ended, or ctx's.
func (s *Session) WaitServing(ctx context.Context) error {
	for {
		s.mu.Lock()
		ch := s.changed
		s.mu.Unlock()
		err := s.Check()
		if err == nil || s.ended.Load() {
			return err
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("%w (waited: %w)", err, ctx.Err())
		}
	}
}

// notify wakes WaitServing and AcquireWait callers. Caller holds mu.
func (s *Session) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// Close ends the session: it stops vouching at once (every ownership is lost with
// ErrSessionClosed), stops its goroutines and waits for them, then revokes the lease, which deletes every owner
// key of it in etcd so other nodes may take the partitions without waiting for the TTL. If
// the revoke fails (etcd unreachable within ctx) the lease expires on its own within the TTL;
// the error says so. Idempotent.
func (s *Session) Close(ctx context.Context) error {
	first := s.end(fmt.Errorf("%w: %w", ErrLost, ErrSessionClosed))
	s.wg.Wait()
	if !first {
		return nil
	}
	if _, err := s.c.cli.Revoke(ctx, s.lease); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return unavailable(fmt.Sprintf("revoke lease %x (it expires within %v)", int64(s.lease), s.ttl), err)
	}
	return nil
}

// end ends the session with err (the first call only, which returns true): every ownership
// is lost, the goroutines stop (waited for, unless end runs on one of them).
func (s *Session) end(err error) bool {
	s.mu.Lock()
	if s.ended.Load() {
		s.mu.Unlock()
		return false
	}
	s.endErr = err
	s.ended.Store(true)
	for k, o := range s.owned {
		o.lose(err)
		delete(s.owned, k)
	}
	s.notify()
	s.mu.Unlock()
	s.cancel()
	close(s.closed)
	return true
}

// keepAlive is the keepalive goroutine: a keepalive every TTL/3 (sooner after a failure),
// each bounded by that period, moving the deadline on each proof.
func (s *Session) keepAlive(ctx context.Context) {
	defer s.wg.Done()
	period := s.ttl / 3
	timer := time.NewTimer(period)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		next := period
		err := s.renew(ctx, period)
		if s.hookRenewed != nil {
			s.hookRenewed()
		}
		if err != nil {
			if s.ended.Load() {
				return
			}
			s.c.log.Warn("cluster: lease keepalive failed", "lease", int64(s.lease), "err", err)
			next = period / 2
		}
		timer.Reset(next)
	}
}

// renew sends one keepalive and, on a proof, moves the deadline (see the invariants).
func (s *Session) renew(ctx context.Context, timeout time.Duration) error {
	start := s.clock.Now()
	kctx, cancel := context.WithTimeout(ctx, timeout)
	resp, err := s.c.cli.KeepAliveOnce(kctx, s.lease)
	cancel()
	if s.hookKeepAlive != nil {
		s.hookKeepAlive()
	}
	if errors.Is(err, rpctypes.ErrLeaseNotFound) || err == nil && resp.TTL <= 0 {
		s.end(fmt.Errorf("%w: lease %x expired in etcd", ErrLost, int64(s.lease)))
		return ErrLost
	}
	if err != nil {
		return unavailable("keepalive", err)
	}
	ttl := min(time.Duration(resp.TTL)*time.Second, s.ttl)
	d := int64(start.Sub(s.origin) + ttl - s.margin)
	if int64(s.clock.Now().Sub(s.origin)) >= s.deadline.Load() {
		// The session lapsed: prove every owner key before vouching again.
		vctx, cancel := context.WithTimeout(ctx, timeout)
		err := s.verify(vctx, false)
		cancel()
		if err != nil {
			return err
		}
	}
	s.mu.Lock()
	if !s.ended.Load() && d > s.deadline.Load() {
		s.deadline.Store(d)
		s.notify()
	}
	s.mu.Unlock()
	return nil
}

// verify reads every owner key of the session (linearizable) and loses the ownerships whose
// key is gone, was created again, or is bound to another lease. With markPending (the
// owner-key watch lost events to a compaction) every pending Acquire is marked to read its
// own key once it has its grant: it has no epoch to verify yet, and the watch will not
// deliver what happened to its key before this read.
func (s *Session) verify(ctx context.Context, markPending bool) error {
	s.mu.Lock()
	var owned []*Ownership
	for _, o := range s.owned {
		if o.epoch.Load() != 0 {
			owned = append(owned, o)
		} else if markPending {
			o.missed = true
		}
	}
	s.mu.Unlock()
	for len(owned) > 0 {
		n := min(len(owned), etcdTxnOpsMax)
		ops := make([]clientv3.Op, n)
		for i, o := range owned[:n] {
			ops[i] = clientv3.OpGet(o.key)
		}
		resp, err := s.c.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return unavailable("verify owner keys", err)
		}
		s.mu.Lock()
		for i, o := range owned[:n] {
			// Judge only the grant the key was read for: one made since (the earlier
			// released meanwhile) was not there to read.
			k := o.key
			if s.owned[k] != o {
				continue
			}
			kvs := resp.Responses[i].GetResponseRange().Kvs
			if len(kvs) != 1 || uint64(kvs[0].CreateRevision) != o.epoch.Load() || clientv3.LeaseID(kvs[0].Lease) != s.lease {
				o.lose(fmt.Errorf("%w: table %q partition %d: owner key no longer this grant's", ErrLost, o.table, o.part))
				delete(s.owned, k)
				s.notify()
			}
		}
		s.mu.Unlock()
		owned = owned[n:]
	}
	return nil
}

// watchOwners is the owner-key watch goroutine: it loses an ownership whose key is deleted
// or created again. Events for keys of a pending Acquire are recorded for it to judge.
func (s *Session) watchOwners(ctx context.Context, rev int64) {
	defer s.wg.Done()
	prefix := s.c.keys.ownPrefix()
	for ctx.Err() == nil {
		wch := s.c.cli.Watch(clientv3.WithRequireLeader(ctx), prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
		for resp := range wch {
			if s.hookWatch != nil {
				s.hookWatch()
			}
			if h := testhook.OwnerWatch; h != nil {
				h(s.holder.Owner)
			}
			if resp.CompactRevision != 0 || errors.Is(resp.Err(), rpctypes.ErrCompacted) {
				// Events are gone: read the keys instead, then watch from after that read.
				gr, err := s.c.cli.Get(ctx, prefix, clientv3.WithCountOnly())
				if err == nil && s.verify(ctx, true) == nil {
					rev = gr.Header.Revision
				}
				break
			}
			if resp.Err() != nil {
				break
			}
			s.mu.Lock()
			for _, ev := range resp.Events {
				rev = ev.Kv.ModRevision
				o := s.owned[string(ev.Kv.Key)]
				if o == nil {
					if ok, isFlush := flushOwnerKey(string(ev.Kv.Key)); isFlush && s.owned[ok] != nil {
						s.owned[ok].flushEvent(ev)
					}
					continue
				}
				o.event(ev)
			}
			s.mu.Unlock()
			if s.hookWatched != nil {
				s.hookWatched(rev)
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond): // a pause before watching again, not synchronisation
		}
	}
}

// LeaseAlive reports whether etcd still holds lease (a Session's Lease): what a resolver of
// an in-doubt transaction asks before it may decide for a coordinator, whose lease id the
// transaction record names. false means the lease expired or was revoked, for good: etcd
// does not reuse the ids it generates (member id, time and counter), and this package never
// chooses one.
func (c *Client) LeaseAlive(ctx context.Context, lease int64) (bool, error) {
	resp, err := c.cli.TimeToLive(ctx, clientv3.LeaseID(lease))
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return false, nil
	}
	if err != nil {
		return false, unavailable(fmt.Sprintf("time to live of lease %x", lease), err)
	}
	return resp.TTL > 0, nil
}
