package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Ownership of partitions. A session owns partition p of table t while the owner key
// <prefix>own/<t>/<p> exists, created by the session's Acquire and bound to its lease. The
// key is created only where none exists (a compare-and-set on its CreateRevision), so at most
// one session holds it at a time, and its CreateRevision, the etcd revision of the creating
// transaction, is the grant's epoch: etcd revisions only grow, so every later grant of the
// partition has a strictly higher epoch, and a storage node that refuses epochs below the
// highest it has seen fences every earlier owner.

// Ownership is a session's grant of one partition. Its methods may be called from any
// goroutine.
type Ownership struct {
	s     *Session
	table string
	part  uint32
	key   string
	// epoch is the grant's revision; 0 while the Acquire that created it is pending.
	epoch atomic.Uint64
	lost  atomic.Bool // set once lostErr is
	// Guarded by s.mu.
	lostErr    error
	done       chan struct{}
	seenDel    int64 // pending only: the latest delete of the key the watch saw
	seenCreate int64 // pending only: the latest CreateRevision of a put the watch saw
	missed     bool  // pending only: a compaction took watch events the key may have had
	// flush is the mover epoch of the partition's flush request (moveflush.go), 0 when
	// none; flushRev the revision it was read at (watch events at or below it are old).
	flush    atomic.Int64
	flushRev int64
}

// FlushRequested returns the mover epoch whose flush request is on the partition (a move
// about to freeze its source; moveflush.go), 0 when none.
func (o *Ownership) FlushRequested() int64 { return o.flush.Load() }

// flushEvent takes a watch event on the partition's flush request. Caller holds s.mu.
func (o *Ownership) flushEvent(ev *clientv3.Event) {
	if ev.Kv.ModRevision <= o.flushRev {
		return
	}
	o.flushRev = ev.Kv.ModRevision
	var epoch int64
	if ev.Type != clientv3.EventTypeDelete {
		e, err := decodeFlush(ev.Kv.Value)
		if err != nil {
			return // not a request this node can answer: the mover's wait ends unanswered
		}
		epoch = e
	}
	o.flush.Store(epoch)
	if f := o.s.moveFlush; f != nil && o.epoch.Load() != 0 {
		f(o, epoch)
	}
}

// AckFlush answers the flush request of mover epoch epoch: this grant's acknowledged writes
// of the partition are flushed. Written only while the owner key is still this grant's.
func (o *Ownership) AckFlush(ctx context.Context, epoch int64) error {
	c, grant := o.s.c, int64(o.epoch.Load())
	resp, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(o.key), "=", grant)).
		Then(clientv3.OpPut(c.keys.flushed(o.table, o.part), string(encodeFlushed(epoch, grant)), clientv3.WithLease(o.s.lease))).Commit()
	if err != nil {
		return unavailable(fmt.Sprintf("answer the flush request of table %q partition %d", o.table, o.part), err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: table %q partition %d: the grant is gone", ErrLost, o.table, o.part)
	}
	return nil
}

// Table returns the table's name.
func (o *Ownership) Table() string { return o.table }

// Part returns the partition.
func (o *Ownership) Part() uint32 { return o.part }

// Epoch returns the grant's epoch: the etcd revision that created the owner key. Every
// commit batch to the partition's storage node carries it.
func (o *Ownership) Epoch() uint64 { return o.epoch.Load() }

// Session returns the session the ownership belongs to.
func (o *Ownership) Session() *Session { return o.s }

// Deadline is the session's Deadline: the ownership is vouched for strictly before it.
func (o *Ownership) Deadline() time.Time { return o.s.Deadline() }

// Done is closed once the ownership is lost for good (Check then returns ErrLost).
func (o *Ownership) Done() <-chan struct{} { return o.done }

// Check returns nil while this node may act as the partition's owner: the grant is not lost
// and the session vouches for its lease (Session.Check). The owner checks it before it
// serves a read from its cache or sends a commit batch; the storage nodes' fences stop what
// a lapsed or lost owner sends anyway. Lock-free, no allocation on success; any goroutine.
func (o *Ownership) Check() error {
	if o.lost.Load() {
		return o.lostErr
	}
	return o.s.Check()
}

// lose ends the ownership with err (the first call). Caller holds s.mu.
func (o *Ownership) lose(err error) {
	if o.lost.Load() {
		return
	}
	o.lostErr = err
	o.lost.Store(true)
	close(o.done)
}

// event judges a watch event on the ownership's key. Caller holds s.mu.
func (o *Ownership) event(ev *clientv3.Event) {
	e := int64(o.epoch.Load())
	if e == 0 {
		if ev.Type == clientv3.EventTypeDelete {
			o.seenDel = max(o.seenDel, ev.Kv.ModRevision)
		} else {
			o.seenCreate = max(o.seenCreate, ev.Kv.CreateRevision)
		}
		return
	}
	// Only what happened after the grant counts: a watch running behind still delivers
	// the events of an earlier grant of this session (its put, its release).
	if ev.Kv.ModRevision > e && (ev.Type == clientv3.EventTypeDelete || ev.Kv.CreateRevision != e) {
		o.drop(fmt.Errorf("%w: table %q partition %d: owner key deleted or granted again at revision %d",
			ErrLost, o.table, o.part, ev.Kv.ModRevision))
	}
}

// drop loses the ownership and forgets it. Caller holds s.mu.
func (o *Ownership) drop(err error) {
	o.lose(err)
	if o.s.owned[o.key] == o {
		delete(o.s.owned, o.key)
	}
	o.s.notify()
}

// Acquire takes the write ownership of partition part of table: it creates the partition's
// owner key, bound to the session's lease, if no session holds it and the partition exists
// in the map. It fails with an *OwnedError (ErrOwned) naming the holder, ErrTableNotFound,
// the session's Check error (a lapsed session grants nothing), or ErrUnavailable. After
// ErrUnavailable (ctx ended, etcd unreachable) the grant may have happened: the key then
// stays bound to this session's lease, blocking other nodes, until an Acquire again adopts
// it (with its epoch) and Releases it, or the session ends. A key of a grant this session
// released is not adopted: Acquire deletes it and creates it anew, with a new epoch. An
// ownership this session holds already is returned as it is. Another Acquire of the same
// partition by this session while one is in progress fails with ErrInvalid.
func (s *Session) Acquire(ctx context.Context, table string, part uint32) (*Ownership, error) {
	o, _, err := s.acquire(ctx, table, part)
	return o, err
}

// AcquireWait is Acquire that, while another session holds the partition, waits for its
// owner key to go (released, or its lease expired: the takeover of a dead node's partitions)
// and tries again, and while this session is lapsed waits for it to serve again, until ctx
// ends.
func (s *Session) AcquireWait(ctx context.Context, table string, part uint32) (*Ownership, error) {
	for {
		o, rev, err := s.acquire(ctx, table, part)
		if errors.Is(err, ErrLapsed) {
			if err := s.WaitServing(ctx); err != nil {
				return nil, err
			}
			continue
		}
		if !errors.Is(err, ErrOwned) {
			return o, err
		}
		if err := s.waitDeleted(ctx, s.c.keys.owner(table, part), rev); err != nil {
			return nil, err
		}
	}
}

// waitDeleted waits for a delete of key after revision rev (or a failed watch: the caller
// tries again either way).
func (s *Session) waitDeleted(ctx context.Context, key string, rev int64) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := s.c.cli.Watch(clientv3.WithRequireLeader(wctx), key, clientv3.WithRev(rev+1), clientv3.WithFilterPut())
	for {
		select {
		case resp, ok := <-wch:
			if !ok || resp.Err() != nil || resp.CompactRevision != 0 || len(resp.Events) > 0 {
				if ctx.Err() != nil {
					return fmt.Errorf("cluster: wait for %s: %w", key, ctx.Err())
				}
				return nil
			}
		case <-s.closed:
			return s.endErr
		case <-ctx.Done():
			return fmt.Errorf("cluster: wait for %s: %w", key, ctx.Err())
		}
	}
}

// acquire is Acquire; on ErrOwned it also returns the revision at which the holder was seen.
func (s *Session) acquire(ctx context.Context, table string, part uint32) (*Ownership, int64, error) {
	if err := validTableName(table); err != nil {
		return nil, 0, err
	}
	if err := s.Check(); err != nil {
		return nil, 0, err
	}
	key, pk := s.c.keys.owner(table, part), s.c.keys.part(table, part)
	s.mu.Lock()
	if s.ended.Load() {
		s.mu.Unlock()
		return nil, 0, s.endErr
	}
	if o := s.owned[key]; o != nil {
		s.mu.Unlock()
		if o.epoch.Load() == 0 {
			return nil, 0, fmt.Errorf("%w: table %q partition %d: another Acquire of it is in progress", ErrInvalid, table, part)
		}
		return o, 0, nil
	}
	// Registered before the transaction, so the watch records what happens to the key
	// from the grant on, even before this goroutine hears the grant.
	o := &Ownership{s: s, table: table, part: part, key: key, done: make(chan struct{})}
	s.owned[key] = o
	s.mu.Unlock()

	var resp *clientv3.TxnResponse
	var err error
	for {
		resp, err = s.c.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0), clientv3.Compare(clientv3.CreateRevision(pk), ">", 0)).
			Then(clientv3.OpPut(key, string(encodeOwner(s.holder)), clientv3.WithLease(s.lease)), clientv3.OpGet(s.c.keys.flush(table, part))).
			Else(clientv3.OpGet(key), clientv3.OpGet(pk, clientv3.WithCountOnly())).
			Commit()
		if err != nil || resp.Succeeded {
			break
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) != 1 || clientv3.LeaseID(kvs[0].Lease) != s.lease || !s.isRetired(key, kvs[0].CreateRevision) {
			break
		}
		// The key of a grant this session released (its delete failed): its epoch must
		// not come back. Delete it, then create the key anew.
		if err = s.deleteOwn(ctx, key, kvs[0].CreateRevision); err != nil {
			break
		}
	}
	var epoch int64
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		// The lease expired before the keepalive goroutine heard of it: the session is over.
		s.end(fmt.Errorf("%w: lease %x expired in etcd", ErrLost, int64(s.lease)))
		err = s.endErr
	case err != nil:
		err = unavailable(fmt.Sprintf("acquire table %q partition %d", table, part), err)
	case resp.Succeeded:
		epoch = resp.Header.Revision
		// The flush request as of the grant (a move that asked before it is answered as
		// one that asks after); the watch's events at or below the grant are older.
		s.mu.Lock()
		if o.flushRev < epoch {
			o.flushRev = epoch
			o.flush.Store(0)
			if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) == 1 {
				if e, derr := decodeFlush(kvs[0].Value); derr == nil {
					o.flush.Store(e)
				}
			}
		}
		s.mu.Unlock()
	default:
		kvs := resp.Responses[0].GetResponseRange().Kvs
		switch {
		case len(kvs) == 1 && clientv3.LeaseID(kvs[0].Lease) == s.lease:
			epoch = kvs[0].CreateRevision // granted to this session by an earlier try
		case len(kvs) == 1:
			h, derr := decodeOwner(kvs[0].Value)
			if derr != nil {
				err = fmt.Errorf("cluster: table %q partition %d: owner key: %w", table, part, derr)
				break
			}
			h.Epoch = uint64(kvs[0].CreateRevision)
			err = &OwnedError{Table: table, Part: part, Holder: h}
		case resp.Responses[1].GetResponseRange().Count == 0:
			err = fmt.Errorf("%w: %q has no partition %d", ErrTableNotFound, table, part)
		default:
			err = fmt.Errorf("%w: table %q partition %d: the compare failed but the key is free; try again", ErrUnavailable, table, part)
		}
	}
	if err == nil {
		err = s.proveMissed(ctx, o, epoch)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if s.owned[key] == o {
			delete(s.owned, key)
		}
		var rev int64
		if resp != nil {
			rev = resp.Header.Revision
		}
		return nil, rev, err
	}
	o.epoch.Store(uint64(epoch))
	if o.lost.Load() { // the session ended meanwhile
		return nil, 0, o.lostErr
	}
	if o.seenDel > epoch || o.seenCreate > epoch {
		o.drop(fmt.Errorf("%w: table %q partition %d: owner key deleted or granted again right after the grant", ErrLost, table, part))
		return nil, 0, o.lostErr
	}
	s.notify()
	if e := o.flush.Load(); e != 0 && s.moveFlush != nil {
		s.moveFlush(o, e)
	}
	return o, 0, nil
}

// proveMissed reads the owner key of the pending Acquire o, granted at epoch, for as long as
// a compaction of the owner-key watch's events marks it: a key found gone, created again or
// bound to another lease counts as a delete the watch saw (the grant is then lost).
func (s *Session) proveMissed(ctx context.Context, o *Ownership, epoch int64) error {
	for {
		s.mu.Lock()
		missed := o.missed
		o.missed = false
		s.mu.Unlock()
		if !missed {
			return nil
		}
		gr, err := s.c.cli.Get(ctx, o.key)
		if err != nil {
			return unavailable(fmt.Sprintf("acquire table %q partition %d: read the granted key", o.table, o.part), err)
		}
		if kvs := gr.Kvs; len(kvs) != 1 || kvs[0].CreateRevision != epoch || clientv3.LeaseID(kvs[0].Lease) != s.lease {
			s.mu.Lock()
			o.seenDel = max(o.seenDel, gr.Header.Revision)
			s.mu.Unlock()
		}
	}
}

// Held returns this session's ownership of partition part of table if it holds one (granted,
// not lost; the session's own view, no etcd read), else nil. Any goroutine.
func (s *Session) Held(table string, part uint32) *Ownership {
	key := s.c.keys.owner(table, part)
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.owned[key]
	if o == nil || o.epoch.Load() == 0 || o.lost.Load() {
		return nil
	}
	return o
}

// Release gives the ownership up: it stops vouching at once (Check returns ErrLost), then
// deletes the owner key if it is still this grant's, so another node may acquire the
// partition without waiting for the lease. The caller must have finished (or failed) every
// write under the grant first. On ErrUnavailable the key may stay until Release is called
// again or the session ends; an Acquire of the partition by this session meanwhile deletes
// it and grants the partition anew, with a new epoch (a released epoch never comes back).
// Idempotent.
func (o *Ownership) Release(ctx context.Context) error {
	s := o.s
	s.mu.Lock()
	o.drop(fmt.Errorf("%w: table %q partition %d: released", ErrLost, o.table, o.part))
	epoch := int64(o.epoch.Load())
	if epoch != 0 {
		// Retired with the drop, in one critical section: an Acquire of the partition
		// that starts once the drop is done already knows not to adopt the key.
		s.retired[o.key] = epoch
	}
	s.mu.Unlock()
	if epoch == 0 {
		return nil
	}
	if err := s.deleteOwn(ctx, o.key, epoch); err != nil {
		return unavailable(fmt.Sprintf("release table %q partition %d", o.table, o.part), err)
	}
	return nil
}

// isRetired reports whether epoch is that of a grant of key this session released.
func (s *Session) isRetired(key string, epoch int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.retired[key] == epoch
}

// deleteOwn deletes key if it is still the grant of epoch under this session's lease, and
// forgets the retired epoch once etcd answered (the key is then gone or another grant's).
func (s *Session) deleteOwn(ctx context.Context, key string, epoch int64) error {
	_, err := s.c.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", epoch), clientv3.Compare(clientv3.LeaseValue(key), "=", s.lease)).
		Then(clientv3.OpDelete(key)).Commit()
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.retired[key] == epoch {
		delete(s.retired, key)
	}
	s.mu.Unlock()
	return nil
}

// Owner reads the current holder of partition part of table (a linearizable read): ok is
// false when nobody holds it. Holder.Epoch is the grant's revision. A storage node checks a
// grant an owner registers with it against this, so it never takes an epoch on trust; a node
// that is not the owner routes a write to Holder.Addr.
func (c *Client) Owner(ctx context.Context, table string, part uint32) (h Holder, ok bool, err error) {
	if err := validTableName(table); err != nil {
		return Holder{}, false, err
	}
	resp, err := c.cli.Get(ctx, c.keys.owner(table, part))
	if err != nil {
		return Holder{}, false, unavailable(fmt.Sprintf("read the owner of table %q partition %d", table, part), err)
	}
	if len(resp.Kvs) == 0 {
		return Holder{}, false, nil
	}
	kv := resp.Kvs[0]
	if h, err = decodeOwner(kv.Value); err != nil {
		return Holder{}, false, fmt.Errorf("cluster: table %q partition %d: owner key: %w", table, part, err)
	}
	h.Epoch = uint64(kv.CreateRevision)
	return h, true, nil
}
