package txnode

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/internal/testkit"
	"github.com/weftdb/weft/storenode"
)

// logCounter is a slog.Handler that counts the records whose message contains each of its
// keys (and passes nothing on).
type logCounter struct {
	mu     sync.Mutex
	keys   []string
	counts map[string]int
}

func newLogCounter(keys ...string) *logCounter {
	return &logCounter{keys: keys, counts: make(map[string]int)}
}

func (h *logCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h *logCounter) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *logCounter) WithGroup(string) slog.Handler            { return h }
func (h *logCounter) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, k := range h.keys {
		if strings.Contains(r.Message, k) {
			h.counts[k]++
		}
	}
	return nil
}

func (h *logCounter) count(key string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.counts[key]
}

// A transaction node heals after a storage node outage longer than every timeout: the storage
// node (a child process, TestHelperStorageNode) is killed with -9 while writers commit, kept
// down past RequestTimeout, the lease (so every lease lapses here) and a lease plus
// ownerInUseMargin (where the node used to give up on it), then restarted on the same
// directory and port. Meanwhile calls fail at once with ErrUnavailable (or ErrLeaseExpired, or
// ErrUnknownOutcome for a commit whose batch was in flight), never past their context. Once it
// is back, reads and writes succeed again without reopening; every acknowledged write is
// there, and each writer's row holds its last acknowledged value or one whose outcome was
// unknown; exactly one "lost" and one "back" line are logged, and no renewal failure per table
// and tick; Close succeeds. Fails on b3f6c9d: the node gave up after a lease plus
// ownerInUseMargin, and every later call failed with "storage node ... unreachable" for good.
func TestStorageNodeOutageHeals(t *testing.T) {
	testkit.SkipUnderRace(t, "a kill suite (child processes)")
	const lease = time.Second
	t.Setenv(helperLeaseEnv, lease.String())
	dir, addr := t.TempDir(), freeLoopbackAddr(t)
	node := startNodeProc(t, dir, addr)
	defer func() { node.kill() }()

	const (
		lost = "lost the storage node"
		back = "the storage node is back"
		renw = "lease renewal failed"
	)
	logs := newLogCounter(lost, back, renw)
	ctx := context.Background()
	const owner = 4242
	const requestTimeout = 300 * time.Millisecond
	db, err := Open(ctx, Options{StoreAddr: addr, OwnerID: owner, CacheBytes: 1 << 20,
		RequestTimeout: requestTimeout, DialTimeout: 200 * time.Millisecond, Logger: slog.New(logs)})
	require.NoError(t, err)
	require.Equal(t, lease, db.info.Lease)
	tab := newTable(t, ctx, db, "players", 64)

	const writers = 4
	ids := make([]uint64, writers)
	for i := range ids {
		ids[i] = insertRow(t, ctx, tab, row(0))
	}

	// Each writer owns a row and writes 1, 2, 3, ... to it: the row must end at its last
	// acknowledged value or at a later one whose outcome was unknown.
	type writerLog struct {
		acked   uint64
		unknown []uint64 // values after acked whose outcome is unknown
	}
	logsW := make([]writerLog, writers)
	var stop atomic.Bool
	var okTotal, okAfter atomic.Int64 // acknowledged writes, and those once the node is back
	var healed atomic.Bool
	var wg sync.WaitGroup
	unexpected := make(chan error, writers)
	for g := range writers {
		wg.Go(func() {
			for v := uint64(1); !stop.Load(); v++ {
				cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				start := time.Now()
				err := tab.Put(cctx, ids[g], row(v))
				took := time.Since(start)
				cancel()
				switch {
				case err == nil:
					logsW[g] = writerLog{acked: v}
					okTotal.Add(1)
					if healed.Load() {
						okAfter.Add(1)
					}
					continue
				case errors.Is(err, ErrUnknownOutcome):
					logsW[g].unknown = append(logsW[g].unknown, v)
				case errors.Is(err, ErrUnavailable), errors.Is(err, ErrLeaseExpired):
					// Refused: nothing applied.
				default:
					unexpected <- err
					return
				}
				if took > 2*time.Second+time.Second {
					unexpected <- errors.New("a write blocked past its context")
					return
				}
				time.Sleep(5 * time.Millisecond) // pacing the retries of a failed write, not synchronisation
			}
		})
	}
	require.Eventually(t, func() bool { return okTotal.Load() >= 50 }, 10*time.Second, 5*time.Millisecond)

	node.kill()
	killed := time.Now()
	// The node notices, and past RequestTimeout calls fail at once.
	require.Eventually(t, func() bool { return errors.Is(db.Err(), ErrUnavailable) }, 10*time.Second, 5*time.Millisecond)
	start := time.Now()
	_, err = db.Tables(ctx)
	require.ErrorIs(t, err, ErrUnavailable)
	require.Less(t, time.Since(start), requestTimeout, "a call during the outage waits")
	// The lease lapses here.
	buf := make([]byte, 64)
	require.Eventually(t, func() bool { return errors.Is(tab.Get(ctx, ids[0], buf), ErrLeaseExpired) }, 10*time.Second, 5*time.Millisecond)
	// The outage outlasts a lease plus ownerInUseMargin, where the node used to give up (the
	// scenario's length, not a synchronisation).
	time.Sleep(time.Until(killed.Add(lease + ownerInUseMargin + 500*time.Millisecond)))

	node = startNodeProc(t, dir, addr)
	restarted := time.Now()
	healed.Store(true)
	require.Eventually(t, func() bool { return okAfter.Load() >= writers }, 10*time.Second, 5*time.Millisecond,
		"writes succeed again once the storage node is back")
	require.Eventually(t, func() bool { return tab.Get(ctx, ids[0], buf) == nil }, 10*time.Second, 5*time.Millisecond,
		"reads succeed again once the storage node is back")
	t.Logf("healed %v after the restart", time.Since(restarted).Round(time.Millisecond))
	newID := insertRow(t, ctx, tab, row(7))
	stop.Store(true)
	wg.Wait()
	select {
	case err := <-unexpected:
		t.Fatalf("a call failed with an error an outage does not explain: %v", err)
	default:
	}
	require.NoError(t, db.Err())

	check := func(tb *Table) {
		for g, id := range ids {
			require.NoError(t, tb.Get(ctx, id, buf))
			v := binary.LittleEndian.Uint64(buf)
			w := logsW[g]
			if v != w.acked {
				require.Contains(t, w.unknown, v, "writer %d: row holds %d, last acknowledged %d", g, v, w.acked)
			}
		}
		require.NoError(t, tb.Get(ctx, newID, buf))
		require.Equal(t, uint64(7), binary.LittleEndian.Uint64(buf))
	}
	check(tab)
	require.NoError(t, db.Close(ctx))
	require.Equal(t, 1, logs.count(lost), "one line when the storage node is lost")
	require.Equal(t, 1, logs.count(back), "one line when it is back")
	require.LessOrEqual(t, logs.count(renw), 1, "renewal failures of an outage are not logged per table and tick")

	// What the storage node has, read by a fresh transaction node.
	db2 := openDB(t, ctx, Options{StoreAddr: addr, OwnerID: owner, CacheBytes: 1 << 20})
	defer db2.Close(ctx)
	tab2 := openTable(t, ctx, db2, "players")
	check(tab2)
}

// switchProxy forwards connections to a storage node while up; down cuts the open ones and
// closes each new one at once (a storage node gone: every dial fails).
type switchProxy struct {
	proxyConns
	up bool
}

func startSwitchProxy(t *testing.T, target string) *switchProxy {
	p := &switchProxy{up: true}
	p.ln = listenLoopback(t)
	acceptPairs(p.ln, target, &p.wg, func(c, s net.Conn) {
		p.mu.Lock()
		defer p.mu.Unlock()
		if !p.up {
			c.Close()
			s.Close()
			return
		}
		p.conns = append(p.conns, c, s)
		p.wg.Add(2)
		go func() { defer p.wg.Done(); io.Copy(s, c); s.Close() }()
		go func() { defer p.wg.Done(); io.Copy(c, s); c.Close() }()
	})
	t.Cleanup(func() {
		p.ln.Close()
		p.set(false)
		p.wg.Wait()
	})
	return p
}

func (p *switchProxy) set(up bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.up = up
	if !up {
		for _, c := range p.conns {
			c.Close()
		}
		p.conns = nil
	}
}

// fakeReconnectTimers is Options.reconnectTimer: the timer of d == grace fires when the test
// sends on fire; every other (a backoff between redials) fires at once, its d recorded.
type fakeReconnectTimers struct {
	grace    time.Duration
	graceSet chan struct{} // a token per grace timer made
	fire     chan time.Time
	mu       sync.Mutex
	backoffs []time.Duration
}

func (f *fakeReconnectTimers) timer(d time.Duration) (<-chan time.Time, func() bool) {
	if d == f.grace {
		f.graceSet <- struct{}{}
		return f.fire, func() bool { return true }
	}
	f.mu.Lock()
	f.backoffs = append(f.backoffs, d)
	f.mu.Unlock()
	c := make(chan time.Time, 1)
	c <- time.Time{}
	return c, func() bool { return false }
}

// The outage's states on an injected clock (this one runs under -race too): for RequestTimeout
// into an outage a call waits for the reconnect within its context; then (the timer fires)
// the store is unavailable: calls and commits fail at once with ErrUnavailable, DB.Err says
// so, and a commit whose batch was in flight gets ErrUnknownOutcome wrapping it, its batch
// kept and applied on reconnect. The redials back off with jitter below redialBackoffMax, for
// as long as the outage lasts; once the storage node is back the node serves again, with one
// "lost" and one "back" line. Does not build on b3f6c9d (no reconnectTimer: the node gave up
// on the storage node after RequestTimeout, for good).
func TestOutageUnavailableThenBack(t *testing.T) {
	ctx := context.Background()
	addr, _ := startStorageNodeWith(t, storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone})
	proxy := startSwitchProxy(t, addr)
	const grace = time.Hour // RequestTimeout: only the injected timer ends it
	timers := &fakeReconnectTimers{grace: grace, graceSet: make(chan struct{}, 4), fire: make(chan time.Time, 1)}
	const lost, back = "lost the storage node", "the storage node is back"
	logs := newLogCounter(lost, back)
	db, err := Open(ctx, Options{StoreAddr: proxy.ln.Addr().String(), OwnerID: 31, RequestTimeout: grace,
		DialTimeout: time.Second, Logger: slog.New(logs), reconnectTimer: timers.timer})
	require.NoError(t, err)
	tab := newTable(t, ctx, db, "t", 64)
	id := insertRow(t, ctx, tab, row(1))

	proxy.set(false)
	recvWithin(t, timers.graceSet, "the outage's RequestTimeout timer")
	// Within RequestTimeout a call waits for the reconnect, as long as its context allows.
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	_, err = db.Tables(short)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, db.Err())
	// A commit whose batch goes out during the outage waits for it.
	putErr := putPending(t, ctx, db, tab, id)

	timers.fire <- time.Now() // RequestTimeout into the outage
	err = recvWithin(t, putErr, "the answer of a commit in flight")
	require.ErrorIs(t, err, ErrUnknownOutcome)
	require.ErrorIs(t, err, ErrUnavailable)
	require.ErrorIs(t, db.Err(), ErrUnavailable)
	_, err = db.Tables(ctx)
	require.ErrorIs(t, err, ErrUnavailable)
	require.ErrorIs(t, tab.Put(ctx, id, row(3)), ErrUnavailable, "a commit during the outage is refused")
	require.Eventually(t, func() bool {
		timers.mu.Lock()
		defer timers.mu.Unlock()
		return len(timers.backoffs) >= 12 // past the cap
	}, 10*time.Second, time.Millisecond)

	proxy.set(true)
	require.Eventually(t, func() bool { return db.Err() == nil }, 10*time.Second, time.Millisecond)
	// The batch in flight at the outage was resent and acknowledged: a Durable Get of its row
	// waits for that.
	buf := make([]byte, 64)
	require.NoError(t, tab.Get(ctx, id, buf))
	require.Equal(t, uint64(2), binary.LittleEndian.Uint64(buf))
	require.NoError(t, tab.Put(ctx, id, row(4)))
	require.NoError(t, tab.Get(ctx, id, buf))
	require.Equal(t, uint64(4), binary.LittleEndian.Uint64(buf))
	require.NoError(t, db.Close(ctx))
	require.Equal(t, 1, logs.count(lost))
	require.Equal(t, 1, logs.count(back))
	timers.mu.Lock()
	for i, d := range timers.backoffs {
		full := min(redialBackoffFirst<<min(i, 20), redialBackoffMax)
		require.GreaterOrEqual(t, d, full/2, "backoff %d", i)
		require.LessOrEqual(t, d, full, "backoff %d", i)
	}
	timers.mu.Unlock()

	db2 := openDB(t, ctx, Options{StoreAddr: addr, OwnerID: 31})
	defer db2.Close(ctx)
	tab2 := openTable(t, ctx, db2, "t")
	require.NoError(t, tab2.Get(ctx, id, buf))
	require.Equal(t, uint64(4), binary.LittleEndian.Uint64(buf))
}

// Close during an outage does not wait it out: once the storage node has been unreachable for
// RequestTimeout (the injected timer fires), Close gives up on the batch in flight (its
// committer gets ErrUnknownOutcome) and returns ErrUnavailable, without the storage node
// coming back. Does not build on b3f6c9d (no reconnectTimer).
func TestCloseDuringOutage(t *testing.T) {
	ctx := context.Background()
	addr, _ := startStorageNodeWith(t, storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone})
	proxy := startSwitchProxy(t, addr)
	const grace = time.Hour
	timers := &fakeReconnectTimers{grace: grace, graceSet: make(chan struct{}, 4), fire: make(chan time.Time, 1)}
	db, err := Open(ctx, Options{StoreAddr: proxy.ln.Addr().String(), OwnerID: 32, RequestTimeout: grace,
		Logger: slog.New(newLogCounter()), reconnectTimer: timers.timer})
	require.NoError(t, err)
	tab := newTable(t, ctx, db, "t", 64)
	id := insertRow(t, ctx, tab, row(1))

	proxy.set(false)
	recvWithin(t, timers.graceSet, "the outage's RequestTimeout timer")
	putErr := putPending(t, ctx, db, tab, id)
	closeErr := make(chan error, 1)
	go func() { closeErr <- db.Close(ctx) }()
	timers.fire <- time.Now()
	require.ErrorIs(t, recvWithin(t, closeErr, "Close during an outage"), ErrUnavailable)
	require.ErrorIs(t, recvWithin(t, putErr, "the commit in flight"), ErrUnknownOutcome)
	require.ErrorIs(t, db.Err(), ErrClosed)
}

// putPending writes row(2) to row id of tab in the background and returns once its batch is
// out to db's remote store, unanswered (its one request pending); it returns the write's error.
func putPending(t *testing.T, ctx context.Context, db *DB, tab *Table, id uint64) <-chan error {
	t.Helper()
	putErr := make(chan error, 1)
	go func() { putErr <- tab.Put(ctx, id, row(2)) }()
	rs := db.remote
	require.Eventually(t, func() bool {
		rs.mu.Lock()
		defer rs.mu.Unlock()
		return len(rs.pendingLocked()) == 1
	}, 10*time.Second, time.Millisecond)
	return putErr
}
