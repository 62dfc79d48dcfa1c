package txnode

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/assert"

	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/txnode/store"
)

// remoteStore talks to a storage node over one pipelined sgio connection: requests of every
// goroutine share the connection, and the client writes all that is queued with one writev.
// Replies to reads are consumed in place (zero copy into the page cache).
//
// Reconnection. When the connection breaks (the storage node restarted, say), the store dials
// again for as long as it is open, with jittered exponential backoff (redialBackoffFirst
// doubling to redialBackoffMax), and logs one line when it loses the storage node and one when
// it has it back. Commit batches that were in flight are kept and sent again on the new
// connection, in seq order, with the same (owner, epoch, seq), however long the outage: the
// storage node applies each at most once and acknowledges a retried one again. Reads, page
// directories, ownership renewals and id grants are retried once they fail with a broken
// connection (an id grant retried may skip ids, never repeat them); catalog changes are not
// retried. A refusal because the connection no longer holds this node's owner id
// (ErrIdentityLost) counts as a broken connection: the store closes it and reconnects.
//
// Outage. For the first RequestTimeout of an outage calls wait for the reconnect (within their
// context). Past it the store is unavailable (unavail): calls fail at once with
// ErrUnavailable, the outage channel is closed (the DB's waits for batches in flight select on
// it, and its admission refuses commits), and DB.Err reports it, until the reconnect.
//
// Invariants (under mu):
//   - dialing: no current connection; exactly one watch goroutine is redialing.
//   - unavail implies dialing; it is cleared, and a fresh outage channel installed, when the
//     new connection is.
//   - a batch leaves commits only through finish or Close: an outage never fails one.
type remoteStore struct {
	opts Options
	info store.Info
	// incarnation is this Open's random instance id, sent in every Hello: the storage node
	// lets a reconnect of the same incarnation replace its old connection at once.
	incarnation [sgio.IncarnationSize]byte

	mu      sync.Mutex
	changed *sync.Cond
	conn    *sgio.Client
	gen     uint64        // bumped per connection
	genA    atomic.Uint64 // gen, for connGen
	dialing bool
	// unavail: dialing for longer than RequestTimeout (see Outage); unavailA mirrors it for
	// lock-free checks. lostAt is when the connection broke, dialErr the last dial's error.
	unavail  bool
	unavailA atomic.Bool
	lostAt   time.Time
	dialErr  error
	commits  commitQueue // the batches in flight, in seq order
	closed   bool
	// outage is closed when unavail is set and replaced by an open one on reconnect.
	outage atomic.Pointer[chan struct{}]
	// onUnavailable, when set (by the DB, before any outage), runs when unavail is set, with
	// mu not held: it wakes the waiters that no reply will wake now.
	onUnavailable func()
	// onBack, when set (by the DB, before any outage), runs once a reconnect has resent the
	// batches in flight, with mu not held.
	onBack func()
	// life ends at Close (stopLife): it cancels a redial's dial and its backoff wait.
	life     context.Context
	stopLife context.CancelFunc

	// rmu guards openRead, the merged read that reads join (remoteread.go); a leaf lock.
	rmu      sync.Mutex
	openRead *readBatch
}

func dialStore(ctx context.Context, opts Options) (store.Store, error) {
	s := &remoteStore{opts: opts}
	rand.Read(s.incarnation[:])
	s.changed = sync.NewCond(&s.mu)
	s.life, s.stopLife = context.WithCancel(context.Background())
	open := make(chan struct{})
	s.outage.Store(&open)
	c, err := s.dialOwner(ctx, opts.OwnerInUseWait)
	if err != nil {
		s.stopLife()
		return nil, err
	}
	h := c.Hello()
	mode := "always"
	if h.SyncMode == sgio.SyncNone {
		mode = "none"
	}
	s.info = store.Info{SyncMode: mode, Lease: time.Duration(h.LeaseMillis) * time.Millisecond, MaxBatchBytes: int(h.MaxBody)}
	s.conn, s.gen = c, 1
	s.genA.Store(1)
	go s.watch(c, 1)
	return s, nil
}

func (s *remoteStore) dial(ctx context.Context) (*sgio.Client, error) {
	return sgio.Dial(ctx, sgio.ClientConfig{
		Addr:        s.opts.StoreAddr,
		Secret:      s.opts.Secret,
		OwnerID:     s.opts.OwnerID,
		Incarnation: s.incarnation,
		Name:        "txnode",
		DialTimeout: s.opts.DialTimeout,
		MaxBody:     sgio.MaxBodyLimit,
	})
}

// dialOwner dials, and dials again while the storage node answers ErrOwnerInUse (another
// incarnation holds the owner id until it closes or is silent for a lease), for up to wait;
// wait 0 is the storage node's lease plus ownerInUseMargin (ownerInUseWait).
func (s *remoteStore) dialOwner(ctx context.Context, wait time.Duration) (*sgio.Client, error) {
	start := time.Now()
	deadline := start.Add(wait)
	backoff := 20 * time.Millisecond
	waited := false
	for {
		c, err := s.dial(ctx)
		if err == nil && waited {
			s.opts.Logger.Info("txnode: the owner id is free at the storage node", "owner", s.opts.OwnerID,
				"addr", s.opts.StoreAddr, "waited", time.Since(start).Round(time.Millisecond))
		}
		if err == nil || !errors.Is(err, sgio.ErrOwnerInUse) {
			return c, err
		}
		if wait == 0 {
			wait = s.ownerInUseWait(ctx)
			deadline = start.Add(wait)
		}
		if !waited {
			// One line for the wait, not one a retry: a silent stall of seconds is what
			// the game developer of issue 23 met.
			waited = true
			s.opts.Logger.Warn("txnode: the owner id is in use at the storage node (another transaction node with it is connected, or one that stopped without Close has not been silent for a lease yet); waiting for it",
				"owner", s.opts.OwnerID, "addr", s.opts.StoreAddr, "up_to", wait.Round(time.Millisecond))
		}
		if !time.Now().Add(backoff).Before(deadline) {
			return nil, fmt.Errorf("txnode: gave up after %v (OwnerInUseWait): %w", wait.Round(time.Millisecond), err)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("txnode: %w (waiting for the owner id: %w)", ctx.Err(), err)
		case <-t.C:
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// ownerInUseWait is the default OwnerInUseWait: the storage node's lease, read from the
// hello reply of a connection that claims no owner id, plus ownerInUseMargin; the default
// lease plus the margin if even that connection fails.
func (s *remoteStore) ownerInUseWait(ctx context.Context) time.Duration {
	c, err := sgio.Dial(ctx, sgio.ClientConfig{Addr: s.opts.StoreAddr, Secret: s.opts.Secret, Name: "txnode-lease",
		DialTimeout: s.opts.DialTimeout})
	if err != nil {
		return ownerInUseLeaseFallback + ownerInUseMargin
	}
	defer c.Close()
	return time.Duration(c.Hello().LeaseMillis)*time.Millisecond + ownerInUseMargin
}

func (s *remoteStore) Info() store.Info { return s.info }

// client returns the current connection, waiting while a reconnect is in progress until ctx
// ends; ErrUnavailable at once while the store is unavailable.
func (s *remoteStore) client(ctx context.Context) (*sgio.Client, uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dialing && !s.unavail && !s.closed {
		// Woken by the end of ctx too: a call must not wait out the whole reconnect
		// (RequestTimeout) past its own deadline.
		stop := context.AfterFunc(ctx, func() {
			s.mu.Lock()
			s.changed.Broadcast()
			s.mu.Unlock()
		})
		defer stop()
	}
	for s.dialing && !s.unavail && !s.closed {
		if ctx.Err() != nil {
			return nil, 0, ctx.Err()
		}
		s.changed.Wait()
	}
	if s.closed {
		return nil, 0, ErrClosed
	}
	if s.dialing {
		return nil, 0, s.unavailLocked()
	}
	return s.conn, s.gen, nil
}

// call runs one request, retrying it on a new connection when retry and the connection broke.
func (s *remoteStore) call(ctx context.Context, m, reply sgio.Message, retry bool) error {
	return s.callWith(ctx, m, reply, retry, false)
}

// callWith is call; urgent sends m with CallIntoUrgent (a lease renewal).
func (s *remoteStore) callWith(ctx context.Context, m, reply sgio.Message, retry, urgent bool) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.opts.RequestTimeout)
		defer cancel()
	}
	for {
		c, gen, err := s.client(ctx)
		if err != nil {
			return err
		}
		if urgent {
			err = c.CallIntoUrgent(ctx, m, reply)
		} else {
			err = c.CallInto(ctx, m, reply)
		}
		s.noteIdentityLost(err, gen) // a call that is not retried too: the next ones reconnect
		if err == nil || !retry || !retryable(err) {
			return err
		}
		s.awaitNewConn(ctx, gen)
	}
}

// awaitNewConn waits until the connection after gen is up, or the store is unavailable.
func (s *remoteStore) awaitNewConn(ctx context.Context, gen uint64) {
	stop := context.AfterFunc(ctx, func() {
		s.mu.Lock()
		s.changed.Broadcast()
		s.mu.Unlock()
	})
	defer stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.gen == gen && !s.unavail && !s.closed && ctx.Err() == nil {
		if !s.dialing && s.conn != nil && s.conn.Err() == nil {
			return
		}
		s.changed.Wait()
	}
}

func tableFrom(t sgio.TableInfo) base.TableInfo {
	return base.TableInfo{ID: t.Table, Name: t.Name, RowBytes: int(t.RowBytes), NextID: t.NextID,
		Cluster: base.ClusterLayout{Partitions: t.Cluster.Partitions, StripePages: t.Cluster.StripePages, Partition: t.Cluster.Partition}}
}

func (s *remoteStore) CreateTable(ctx context.Context, name string, rowBytes int) (base.TableInfo, error) {
	var r sgio.TableInfo
	err := s.call(ctx, &sgio.CreateTable{RowBytes: uint16(rowBytes), Name: name}, &r, false)
	return tableFrom(r), err
}

func (s *remoteStore) CreateClusterTable(ctx context.Context, name string, rowBytes int, l base.ClusterLayout) (base.TableInfo, error) {
	var r sgio.TableInfo
	err := s.call(ctx, &sgio.CreateClusterTable{RowBytes: uint16(rowBytes), Name: name,
		Layout: l}, &r, false)
	return tableFrom(r), err
}

func (s *remoteStore) OpenTable(ctx context.Context, name string) (base.TableInfo, error) {
	var r sgio.TableInfo
	err := s.call(ctx, &sgio.OpenTable{Name: name}, &r, true)
	return tableFrom(r), err
}

func (s *remoteStore) Ping(ctx context.Context) error {
	return s.call(ctx, &sgio.Ping{}, &sgio.Pong{}, true)
}

func (s *remoteStore) ListTables(ctx context.Context) ([]base.TableInfo, error) {
	var r sgio.TableList
	if err := s.call(ctx, &sgio.ListTables{}, &r, true); err != nil {
		return nil, err
	}
	out := make([]base.TableInfo, len(r.Tables))
	for i, t := range r.Tables {
		out[i] = tableFrom(t)
	}
	return out, nil
}

// DropTable drops on behalf of the connection's owner id (the storage node trusts no other),
// which is the DB's: owner is not sent.
func (s *remoteStore) DropTable(ctx context.Context, name string, _ uint64) error {
	return s.call(ctx, &sgio.DropTable{Name: name}, &sgio.OK{}, false)
}

func (s *remoteStore) Acquire(ctx context.Context, table uint32, owner, epoch uint64, flags store.AcquireFlags) (base.Grant, error) {
	var r sgio.Grant
	// A renewal of the store's own lease (a nonzero epoch, no flags) is urgent: it must not
	// wait behind the commits and reads of a busy connection (sgio.Client.CallIntoUrgent);
	// the storage node answers it on its event loop. An etcd grant's registration is not:
	// the storage node verifies it off the loop, against etcd. Both may be retried
	// (registering a current grant again is a renewal).
	renewal := epoch != 0
	urgent := renewal && flags == 0
	err := s.callWith(ctx, &sgio.Acquire{Table: table, Flags: uint32(flags), Owner: owner, Epoch: epoch}, &r, renewal, urgent)
	return base.Grant{Table: r.Table, Owner: r.Owner, Epoch: r.Epoch, Lease: time.Duration(r.LeaseMillis) * time.Millisecond, LastSeq: r.LastSeq}, err
}

func (s *remoteStore) AllocIDs(ctx context.Context, table uint32, owner, epoch uint64, pages int) (uint64, uint64, error) {
	var r sgio.IDRange
	err := s.call(ctx, &sgio.AllocIDs{Table: table, Owner: owner, Epoch: epoch, Pages: uint32(pages)}, &r, true)
	return r.First, r.Count, err
}

func (s *remoteStore) PageDir(ctx context.Context, table uint32, lo, hi uint64, max int, dst []store.PageInfo) ([]store.PageInfo, uint64, error) {
	var r sgio.PageDirReply
	err := s.call(ctx, &sgio.PageDir{Table: table, Lo: lo, Hi: hi, MaxEntries: uint32(max)}, &r, true)
	if err != nil {
		return dst, 0, err
	}
	for _, e := range r.Entries {
		dst = append(dst, store.PageInfo{Page: e.Page, Present: e.Present})
	}
	return dst, r.Next, nil
}

// Read sends its pages in a ReadPages frame, merged with the reads of other goroutines
// (remoteread.go), and fills from the reply in place, on the connection's receiver goroutine.
// Warm, it allocates nothing.
func (s *remoteStore) Read(ctx context.Context, reqs []base.PageWant, fill func(int, uint64, uint64, []byte)) error {
	ctx, release := boundCtx(ctx, s.opts.RequestTimeout)
	defer release()
	r := getRemoteRead(reqs, fill)
	defer r.put()
	for {
		c, gen, err := s.client(ctx)
		if err != nil {
			return err
		}
		err = s.sendRead(ctx, c, r)
		if err == nil {
			err = r.wait(ctx)
		}
		if err == errReadAgain {
			continue // r.alone is set, or the batch was never queued
		}
		if err == nil || !retryable(err) {
			return err
		}
		s.noteIdentityLost(err, gen)
		s.awaitNewConn(ctx, gen)
	}
}

// sendRead sends r: in the connection's open batch, or in a new batch it opens and queues,
// or alone (a large read, or one whose batch failed).
func (s *remoteStore) sendRead(ctx context.Context, c *sgio.Client, r *remoteRead) error {
	if r.alone || len(r.msg.Wants) > readMergeWantsMax/2 || r.msg.Validate() != nil ||
		r.msg.BodySize() > c.MaxRequestBody() {
		return c.Send(ctx, &r.msg, r.reply) // alone, it gets its own error if it is refused
	}
	s.rmu.Lock()
	if b := s.openRead; b != nil && b.join(c, r) {
		s.rmu.Unlock()
		return nil
	}
	b := getReadBatch(c)
	if !b.join(c, r) {
		assert.Failf("txnode: a read of %d page wants does not fit an empty batch", len(r.msg.Wants))
	}
	s.openRead = b
	s.rmu.Unlock()
	err := c.Send(ctx, b, b.reply)
	if err == nil {
		return nil
	}
	// Not queued: its reply callback never runs. The reads that joined meanwhile go again.
	members := b.seal()
	for _, m := range members {
		if m != r {
			m.deliver(errReadAgain)
		}
	}
	s.rmu.Lock()
	if s.openRead == b {
		s.openRead = nil
	}
	b.recycle()
	s.rmu.Unlock()
	return err
}

func fillFromSegments(body []byte, n int, fill func(int, uint64, uint64, []byte)) error {
	it, err := sgio.ViewSegments(body)
	if err != nil {
		return err
	}
	if it.Len() != n {
		return fmt.Errorf("txnode: %d segments answer %d page requests: %w", it.Len(), n, sgio.ErrMalformed)
	}
	var seg base.Segment
	for i := 0; it.Next(&seg); i++ {
		fill(i, seg.Data, seg.Clear, seg.Rows)
	}
	return nil
}

// releaseWaitMax bounds Close's Release request.
const releaseWaitMax = 2 * time.Second

// Close releases this node's tables and owner id at the storage node (Release) when every
// batch is acknowledged, so a new owner or incarnation need not wait for a lease, fails the
// batches still in flight with ErrUnknownOutcome, and closes the connection.
func (s *remoteStore) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	if len(s.pendingLocked()) == 0 && !s.dialing && s.conn != nil && s.conn.Err() == nil {
		c := s.conn
		s.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), min(s.opts.RequestTimeout, releaseWaitMax))
		if err := c.CallInto(ctx, &sgio.Release{Owner: s.opts.OwnerID}, &sgio.OK{}); err != nil {
			s.opts.Logger.Warn("txnode: releasing the owner id at the storage node", "err", err)
		}
		cancel()
		s.mu.Lock()
	}
	s.closed = true
	s.stopLife()
	c := s.conn
	failed := s.pendingLocked()
	for _, rc := range failed {
		rc.fin = true
	}
	s.commits.reset()
	s.changed.Broadcast()
	s.mu.Unlock()
	for _, rc := range failed {
		rc.done(0, fmt.Errorf("%w: store closed", ErrUnknownOutcome))
	}
	if c != nil {
		return c.Close()
	}
	return nil
}

// connGen is the generation of the current connection (bumped per reconnect): a batch sent
// on an earlier one may have been sent twice (resendInFlight). Any goroutine; lock-free.
func (s *remoteStore) connGen() uint64 { return s.genA.Load() }
