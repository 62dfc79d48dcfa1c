package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"path"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/testkit"
	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/logicpage"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// The server's tests drive a real Server over 127.0.0.1 with sgio.Client (or, for bad clients,
// a raw net.Conn), each bounded by srvTestTimeout, and check for leaked goroutines once the
// server and its engine have stopped.

const srvTestTimeout = 20 * time.Second

var srvSecret = []byte("5c8e1f0a9b2d47e6a3f1c0d8b7e69a42")

// srvOtherSecret is a valid secret that is not the server's.
var srvOtherSecret = []byte("d0c3a9b8e7f61524a3b2c1d0e9f8a7b6")

// srvPeerSecret and srvOperatorSecret are the test server's peer and operator secrets
// (roles.go); srvSecret is its clients'.
var (
	srvPeerSecret     = []byte("7a41c9e03b5d82f6e1c4a7b09d3f5e28")
	srvOperatorSecret = []byte("e93b1c7d05a2f84b6c1e9d3a7f052b4c")
)

// asPeer and asOperator dial with the peer's or the operator's secret (env.dial's mods).
func asPeer(cfg *sgio.ClientConfig)     { cfg.Secret = srvPeerSecret }
func asOperator(cfg *sgio.ClientConfig) { cfg.Secret = srvOperatorSecret }

// asOwner dials with owner's derived secret (sgio.DeriveOwnerSecret of srvSecret), as a game
// server given only its own owner's secret.
func asOwner(owner uint64) func(*sgio.ClientConfig) {
	return func(cfg *sgio.ClientConfig) {
		secret, err := sgio.DeriveOwnerSecret(srvSecret, owner)
		if err != nil {
			panic(err)
		}
		cfg.Secret = []byte(secret)
	}
}

// srvEnv is one running server of a test.
type srvEnv struct {
	t     testing.TB
	srv   *Server
	addr  string
	dir   string
	logs  *testkit.SyncBuffer
	clock *fakeClock // the engine's lease clock, when the test asked for one

	closedMu sync.Mutex
	closed   chan *session // sessions whose connection closed, when watched
}

// srvOpts adjusts a test server's configuration.
type srvOpts func(*Config)

// startServer starts a server on 127.0.0.1:0 over a fresh directory (unless cfg names one),
// stopped and leak-checked at the end of the test.
func startServer(t testing.TB, mods ...srvOpts) *srvEnv {
	t.Helper()
	if tt, ok := t.(*testing.T); ok {
		// gnet hands registered connections over through its ants worker pool, whose idle
		// workers live on for a while: a pool, not a leak.
		opts := []goleak.Option{goleak.IgnoreCurrent(), goleak.IgnoreTopFunction("github.com/panjf2000/ants/v2.(*goWorker).run.func1")}
		tt.Cleanup(func() { goleak.VerifyNone(tt, opts...) })
	}
	env := &srvEnv{t: t, logs: &testkit.SyncBuffer{}}
	logger := slog.New(slog.NewTextHandler(env.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg := Config{
		Listen:         "127.0.0.1:0",
		Secret:         srvSecret,
		PeerSecret:     srvPeerSecret,
		OperatorSecret: srvOperatorSecret,
		EventLoops:     2,
		Logger:         logger,
		AuthTimeout:    5 * time.Second,
		// Short, so that tests of wrong proofs take little time; the delay itself is
		// tested with its own value.
		AuthFailDelay: 20 * time.Millisecond,
		Options: storenode.Options{
			Sync:               storenode.SyncNone,
			CacheBytes:         8 << 20,
			CheckpointInterval: -1,
			Logger:             logger,
		},
	}
	for _, m := range mods {
		m(&cfg)
	}
	if cfg.Options.Dir == "" && cfg.Engine == nil {
		cfg.Options.Dir = t.TempDir()
	}
	env.dir = cfg.Options.Dir
	s, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, s.Start())
	env.srv = s
	env.addr = s.Addr().String()
	t.Cleanup(func() { env.stop() })
	return env
}

// withClock gives the engine a fake lease clock, returned through *c.
func withClock(c **fakeClock) srvOpts {
	return func(cfg *Config) {
		*c = &fakeClock{}
		cfg.Options.Now = (*c).Now
	}
}

// withFaultFS puts the engine on a fresh fault-injecting file system (directory "db"),
// returned through *fs, and has it fsync every commit (SyncAlways).
func withFaultFS(fs **vfs.FaultFS) srvOpts {
	return func(cfg *Config) {
		*fs = vfs.NewFaultFS()
		cfg.Options.Dir, cfg.Options.FS, cfg.Options.Sync = "db", *fs, storenode.SyncAlways
	}
}

// stop shuts the server down (idempotent) and checks it stopped cleanly.
func (env *srvEnv) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), srvTestTimeout)
	defer cancel()
	require.NoError(env.t, env.srv.Shutdown(ctx))
	if env.t.Failed() {
		env.t.Logf("server log:\n%s", env.logs.String())
	}
}

// watchCloses makes closed sessions observable through env.closed.
func (env *srvEnv) watchCloses() {
	env.closed = make(chan *session, 1024)
	env.srv.mu.Lock()
	env.srv.closeHook = func(s *session) { env.closed <- s }
	env.srv.mu.Unlock()
}

// waitClosed waits for n sessions to close.
func (env *srvEnv) waitClosed(n int) {
	env.t.Helper()
	timer := time.NewTimer(srvTestTimeout)
	defer timer.Stop()
	for range n {
		select {
		case <-env.closed:
		case <-timer.C:
			env.t.Fatalf("sessions did not close within %v", srvTestTimeout)
		}
	}
}

// dial connects an sgio client as owner and closes it at the end of the test.
// sessionOf returns the server's session of owner (the test fails if there is none; of
// several, any one).
func (env *srvEnv) sessionOf(t testing.TB, owner uint64) *session {
	t.Helper()
	var sess *session
	env.srv.mu.Lock()
	for x := range env.srv.sessions {
		if x.owner == owner {
			sess = x
		}
	}
	env.srv.mu.Unlock()
	require.NotNil(t, sess)
	return sess
}

func (env *srvEnv) dial(owner uint64, mods ...func(*sgio.ClientConfig)) *sgio.Client {
	env.t.Helper()
	c, err := env.tryDial(owner, mods...)
	require.NoError(env.t, err)
	env.t.Cleanup(func() { _ = c.Close() })
	return c
}

func (env *srvEnv) tryDial(owner uint64, mods ...func(*sgio.ClientConfig)) (*sgio.Client, error) {
	cfg := sgio.ClientConfig{Addr: env.addr, Secret: srvSecret, OwnerID: owner, Name: "server-test", DialTimeout: srvTestTimeout}
	for _, m := range mods {
		m(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), srvTestTimeout)
	defer cancel()
	return sgio.Dial(ctx, cfg)
}

// srvCtx bounds a test's calls.
func srvCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), srvTestTimeout)
	t.Cleanup(cancel)
	return ctx
}

// srvCommit builds a commit of one 64-byte row per id.
func srvCommit(table uint32, owner, epoch, seq uint64, ids []uint64, v uint64) *sgio.Commit {
	m := &sgio.Commit{Owner: owner, Seq: seq, Fences: []base.Fence{{Table: table, Epoch: epoch}}}
	for _, id := range ids {
		m.Segments = append(m.Segments, base.Segment{Table: table, RowBytes: 64, Page: id / 64, Data: 1 << (id % 64), Rows: testkit.Row64(v)})
	}
	return m
}

// srvReadRow reads one row over the wire; ok is false when it is absent.
func srvReadRow(t testing.TB, c *sgio.Client, table uint32, id uint64) ([]byte, bool) {
	t.Helper()
	var r sgio.Segments
	err := c.CallInto(srvCtx(t), &sgio.ReadPages{Wants: []base.PageWant{{Table: table, Page: id / 64, Want: 1 << (id % 64)}}}, &r)
	require.NoError(t, err)
	require.Len(t, r.Segments, 1)
	s := r.Segments[0]
	if s.Data == 0 {
		require.Equal(t, uint64(1)<<(id%64), s.Clear)
		return nil, false
	}
	return bytes.Clone(s.Rows), true
}

// srvTable creates a table and has owner acquire it.
func srvTable(t testing.TB, c *sgio.Client, name string, owner uint64) (sgio.TableInfo, sgio.Grant) {
	t.Helper()
	var ti sgio.TableInfo
	require.NoError(t, c.CallInto(srvCtx(t), &sgio.CreateTable{Name: name, RowBytes: 64}, &ti))
	var g sgio.Grant
	require.NoError(t, c.CallInto(srvCtx(t), &sgio.Acquire{Table: ti.Table, Owner: owner}, &g))
	require.NoError(t, srvGrant(srvCtx(t), c, ti.Table, owner, g.Epoch, testGrantPages))
	return ti, g
}

// srvTableWithRow creates the table name through c and acquires it as testOwner (srvTable),
// then commits row 1 of value v; it returns the table and the grant it committed under.
func srvTableWithRow(t testing.TB, ctx context.Context, c *sgio.Client, name string, v uint64) (sgio.TableInfo, sgio.Grant) {
	t.Helper()
	ti, g := srvTable(t, c, name, testOwner)
	require.NoError(t, c.CallInto(ctx, srvCommit(ti.Table, testOwner, g.Epoch, g.LastSeq+1, []uint64{1}, v), &sgio.CommitAck{}))
	return ti, g
}

// srvAcquired creates table name (64-byte rows) through c and has testOwner acquire it (no
// ids granted: srvAllocTable, srvGrant).
func srvAcquired(t testing.TB, ctx context.Context, c *sgio.Client, name string) (sgio.TableInfo, sgio.Grant) {
	t.Helper()
	var ti sgio.TableInfo
	require.NoError(t, c.CallInto(ctx, &sgio.CreateTable{Name: name, RowBytes: 64}, &ti))
	var g sgio.Grant
	require.NoError(t, c.CallInto(ctx, &sgio.Acquire{Table: ti.Table, Owner: testOwner}, &g))
	return ti, g
}

// srvAllocTable is srvAcquired, then allocates the table pages pages of ids (sgio.AllocIDs).
func srvAllocTable(t testing.TB, ctx context.Context, c *sgio.Client, name string, pages uint32) (sgio.TableInfo, sgio.Grant) {
	t.Helper()
	ti, g := srvAcquired(t, ctx, c, name)
	require.NoError(t, c.CallInto(ctx, &sgio.AllocIDs{Table: ti.Table, Owner: testOwner, Epoch: g.Epoch, Pages: pages}, &sgio.IDRange{}))
	return ti, g
}

// srvGrant has owner granted the ids of table's first pages pages over the wire, as a
// transaction node does before it inserts (rows never granted are refused), when the table's
// ids are not granted that far yet.
func srvGrant(ctx context.Context, c *sgio.Client, table uint32, owner, epoch uint64, pages int) error {
	var ti sgio.TableInfo
	var tables sgio.TableList
	if err := c.CallInto(ctx, &sgio.ListTables{}, &tables); err != nil {
		return err
	}
	for _, info := range tables.Tables {
		if info.Table == table {
			ti = info
		}
	}
	want := uint64(pages) * logicpage.RowsPerPage
	if ti.NextID >= want {
		return nil
	}
	return c.CallInto(ctx, &sgio.AllocIDs{Table: table, Owner: owner, Epoch: epoch, Pages: uint32((want - ti.NextID) / logicpage.RowsPerPage)}, &sgio.IDRange{})
}

// bigPage creates the table "big" of the largest rows through owner (the client of owner id 5),
// takes its grant and commits its page 0 full (64 rows of zeros, 256 KiB): a page whose reads
// fill a connection's output fast.
func bigPage(t testing.TB, owner *sgio.Client) sgio.TableInfo {
	t.Helper()
	var ti sgio.TableInfo
	require.NoError(t, owner.CallInto(srvCtx(t), &sgio.CreateTable{Name: "big", RowBytes: sgio.RowBytesMax}, &ti))
	var g sgio.Grant
	require.NoError(t, owner.CallInto(srvCtx(t), &sgio.Acquire{Table: ti.Table, Owner: 5}, &g))
	require.NoError(t, srvGrant(srvCtx(t), owner, ti.Table, 5, g.Epoch, 1))
	rows := make([]byte, 64*sgio.RowBytesMax)
	commit := &sgio.Commit{Owner: 5, Seq: 1, Fences: []base.Fence{{Table: ti.Table, Epoch: g.Epoch}},
		Segments: []base.Segment{{Table: ti.Table, RowBytes: sgio.RowBytesMax, Page: 0, Data: ^uint64(0), Rows: rows}}}
	require.NoError(t, owner.CallInto(srvCtx(t), commit, &sgio.CommitAck{}))
	return ti
}

func TestServerHandshake(t *testing.T) {
	env := startServer(t)
	c := env.dial(1)
	h := c.Hello()
	require.Equal(t, uint16(sgio.Version), h.Version)
	require.Equal(t, sgio.SyncNone, h.SyncMode)
	require.Equal(t, uint32(DefaultMaxBody), h.MaxBody)
	require.Equal(t, uint32(DefaultMaxInflight), h.MaxInflight)
	require.Equal(t, uint32(storenode.DefaultLeaseDuration.Milliseconds()), h.LeaseMillis)

	// A wrong secret fails: the client proves first, and the server refuses its proof.
	_, err := env.tryDial(2, func(cfg *sgio.ClientConfig) { cfg.Secret = srvOtherSecret })
	require.ErrorIs(t, err, sgio.ErrAuthFailed)
	raw := dialRaw(t, env.addr)
	hr := raw.hello(3)
	raw.send(1, &sgio.Auth{Proof: sgio.ClientProof([]byte("a guess"), hr.Nonce, raw.nonce, raw.transcript)})
	raw.expectError(1, sgio.ErrAuthFailed)
	raw.expectClosed()
	require.Contains(t, env.logs.String(), "authentication failed")

	// The first client is still served.
	require.NoError(t, c.CallInto(srvCtx(t), &sgio.Ping{}, &sgio.Pong{}))
	require.GreaterOrEqual(t, env.srv.Stats().AuthFailures, uint64(1))
}

func TestServerRefusesNonLoopbackWithoutSecret(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:7070", ":7070", "[::]:0", "10.1.2.3:7070", "example.com:7070"} {
		_, err := New(Config{Listen: addr, Options: storenode.Options{Dir: t.TempDir()}})
		require.ErrorContains(t, err, "non-loopback", addr)
		_, err = New(Config{Listen: addr, Secret: srvSecret, Options: storenode.Options{Dir: t.TempDir()}})
		require.NoError(t, err, addr)
		_, err = New(Config{Listen: addr, Secret: []byte("topsecret-123"), Options: storenode.Options{Dir: t.TempDir()}})
		require.ErrorIs(t, err, sgio.ErrWeakSecret, addr)
	}
	for _, addr := range []string{"127.0.0.1:0", "localhost:7070", "[::1]:7070"} {
		_, err := New(Config{Listen: addr, Options: storenode.Options{Dir: t.TempDir()}})
		require.NoError(t, err, addr)
	}
	s, err := New(Config{})
	require.NoError(t, err)
	require.Equal(t, DefaultListen, s.cfg.Listen)
}

func TestServerRoundTrip(t *testing.T) {
	env := startServer(t)
	const owner = 5
	c := env.dial(owner)
	ctx := srvCtx(t)

	require.NoError(t, c.CallInto(ctx, &sgio.Ping{}, &sgio.Pong{}))

	var ti sgio.TableInfo
	require.NoError(t, c.CallInto(ctx, &sgio.CreateTable{Name: "players", RowBytes: 64}, &ti))
	require.Equal(t, "players", ti.Name)
	require.Equal(t, uint16(64), ti.RowBytes)
	err := c.CallInto(ctx, &sgio.CreateTable{Name: "players", RowBytes: 64}, &ti)
	require.ErrorIs(t, err, sgio.ErrTableExists)
	err = c.CallInto(ctx, &sgio.OpenTable{Name: "missing"}, &ti)
	require.ErrorIs(t, err, sgio.ErrTableNotFound)
	var opened sgio.TableInfo
	require.NoError(t, c.CallInto(ctx, &sgio.OpenTable{Name: "players"}, &opened))
	require.Equal(t, ti.Table, opened.Table)

	var g sgio.Grant
	require.NoError(t, c.CallInto(ctx, &sgio.Acquire{Table: ti.Table, Owner: owner}, &g))
	require.Equal(t, uint64(owner), g.Owner)
	require.Equal(t, uint64(1), g.Epoch)
	require.Equal(t, uint32(storenode.DefaultLeaseDuration.Milliseconds()), g.LeaseMillis)
	// A request for another owner than the session's is fenced.
	err = c.CallInto(ctx, &sgio.Acquire{Table: ti.Table, Owner: owner + 1}, &g)
	require.ErrorIs(t, err, sgio.ErrFenced)

	var ids sgio.IDRange
	require.NoError(t, c.CallInto(ctx, &sgio.AllocIDs{Table: ti.Table, Owner: owner, Epoch: 1, Pages: 2}, &ids))
	require.Equal(t, sgio.IDRange{First: 0, Count: 128}, ids)

	var ack sgio.CommitAck
	require.NoError(t, c.CallInto(ctx, srvCommit(ti.Table, owner, 1, 1, []uint64{3, 70}, 100), &ack))
	require.Equal(t, uint64(1), ack.Seq)
	require.NotZero(t, ack.LSN)
	del := &sgio.Commit{Owner: owner, Seq: 2, Fences: []base.Fence{{Table: ti.Table, Epoch: 1}},
		Segments: []base.Segment{{Table: ti.Table, RowBytes: 64, Page: 1, Clear: 1 << 6}}}
	require.NoError(t, c.CallInto(ctx, del, &ack))

	row, ok := srvReadRow(t, c, ti.Table, 3)
	require.True(t, ok)
	require.Equal(t, testkit.Row64(100), row)
	_, ok = srvReadRow(t, c, ti.Table, 70)
	require.False(t, ok, "deleted")
	_, ok = srvReadRow(t, c, ti.Table, 4)
	require.False(t, ok, "never written")
	var segs sgio.Segments
	err = c.CallInto(ctx, &sgio.ReadPages{Wants: []base.PageWant{{Table: 99, Page: 0, Want: 1}}}, &segs)
	require.ErrorIs(t, err, sgio.ErrTableNotFound)

	var dir sgio.PageDirReply
	require.NoError(t, c.CallInto(ctx, &sgio.PageDir{Table: ti.Table, Lo: 0, Hi: 1 << 20}, &dir))
	require.Equal(t, []sgio.PageEntry{{Page: 0, Present: 1 << 3}}, dir.Entries)
	require.Equal(t, uint64(1<<20), dir.Next)

	var list sgio.TableList
	require.NoError(t, c.CallInto(ctx, &sgio.ListTables{}, &list))
	require.Len(t, list.Tables, 1)
	require.Equal(t, "players", list.Tables[0].Name)
	require.Equal(t, uint64(128), list.Tables[0].NextID)

	var st sgio.StatsReply
	require.NoError(t, c.CallInto(ctx, &sgio.Stats{}, &st))
	stats := map[string]uint64{}
	for _, s := range st.Stats {
		stats[s.Name] = s.Value
	}
	require.Equal(t, uint64(2), stats["commits"])
	require.Equal(t, uint64(1), stats["connections"])
	require.GreaterOrEqual(t, stats["requests"], uint64(10))

	require.NoError(t, c.CallInto(ctx, &sgio.DropTable{Name: "players"}, &sgio.OK{}))
	err = c.CallInto(ctx, &sgio.OpenTable{Name: "players"}, &ti)
	require.ErrorIs(t, err, sgio.ErrTableNotFound)
}

// TestServerFencing: an owner whose lease expired, and who comes back with its old epoch after
// another owner was granted the table, has its batches and id grants rejected.
func TestServerFencing(t *testing.T) {
	var clock *fakeClock
	env := startServer(t, withClock(&clock))
	a, b := env.dial(1), env.dial(2)
	ctx := srvCtx(t)
	ti, ga := srvTable(t, a, "fenced", 1)
	var ack sgio.CommitAck
	require.NoError(t, a.CallInto(ctx, srvCommit(ti.Table, 1, ga.Epoch, 1, []uint64{1}, 10), &ack))

	// While A's lease lives, B is refused.
	var gb sgio.Grant
	err := b.CallInto(ctx, &sgio.Acquire{Table: ti.Table, Owner: 2}, &gb)
	require.ErrorIs(t, err, sgio.ErrOwned)

	clock.Advance(storenode.DefaultLeaseDuration + time.Second)
	require.NoError(t, b.CallInto(ctx, &sgio.Acquire{Table: ti.Table, Owner: 2}, &gb))
	require.Greater(t, gb.Epoch, ga.Epoch)

	err = a.CallInto(ctx, srvCommit(ti.Table, 1, ga.Epoch, 2, []uint64{1}, 20), &ack)
	require.ErrorIs(t, err, sgio.ErrFenced)
	err = a.CallInto(ctx, &sgio.AllocIDs{Table: ti.Table, Owner: 1, Epoch: ga.Epoch, Pages: 1}, &sgio.IDRange{})
	require.ErrorIs(t, err, sgio.ErrFenced)
	// Renewing the old grant fails too.
	err = a.CallInto(ctx, &sgio.Acquire{Table: ti.Table, Owner: 1, Epoch: ga.Epoch}, &sgio.Grant{})
	require.ErrorIs(t, err, sgio.ErrFenced)

	// The new owner's batch goes through; the row is B's, never A's stale one.
	require.NoError(t, b.CallInto(ctx, srvCommit(ti.Table, 2, gb.Epoch, 1, []uint64{1}, 30), &ack))
	row, ok := srvReadRow(t, b, ti.Table, 1)
	require.True(t, ok)
	require.Equal(t, testkit.Row64(30), row)
}

// TestServerLeaseRenewedByTraffic: any request from the owner (a Ping here) renews its leases.
func TestServerLeaseRenewedByTraffic(t *testing.T) {
	var clock *fakeClock
	env := startServer(t, withClock(&clock))
	a, b := env.dial(1), env.dial(2)
	ctx := srvCtx(t)
	ti, _ := srvTable(t, a, "renewed", 1)
	for range 4 {
		clock.Advance(storenode.DefaultLeaseDuration * 3 / 4)
		require.NoError(t, a.CallInto(ctx, &sgio.Ping{}, &sgio.Pong{}))
	}
	// Three lease lengths later, A's lease still lives.
	clock.Advance(storenode.DefaultLeaseDuration / 2)
	err := b.CallInto(ctx, &sgio.Acquire{Table: ti.Table, Owner: 2}, &sgio.Grant{})
	require.ErrorIs(t, err, sgio.ErrOwned)
	// Without traffic it expires.
	clock.Advance(storenode.DefaultLeaseDuration)
	require.NoError(t, b.CallInto(ctx, &sgio.Acquire{Table: ti.Table, Owner: 2}, &sgio.Grant{}))
}

// TestServerRetriedBatch: a batch sent again with the same (owner, epoch, seq) is acknowledged
// again but applied once: it does not overwrite what a later batch wrote.
func TestServerRetriedBatch(t *testing.T) {
	env := startServer(t)
	c := env.dial(1)
	ctx := srvCtx(t)
	ti, g := srvTable(t, c, "retried", 1)
	var ack1, ack2, again sgio.CommitAck
	first := srvCommit(ti.Table, 1, g.Epoch, 1, []uint64{5}, 1)
	require.NoError(t, c.CallInto(ctx, first, &ack1))
	require.NoError(t, c.CallInto(ctx, srvCommit(ti.Table, 1, g.Epoch, 2, []uint64{5}, 2), &ack2))
	require.NoError(t, c.CallInto(ctx, first, &again))
	require.Equal(t, uint64(1), again.Seq)
	row, ok := srvReadRow(t, c, ti.Table, 5)
	require.True(t, ok)
	require.Equal(t, testkit.Row64(2), row, "the retried batch was applied again")
	st := env.srv.Engine().Stats()
	require.Equal(t, uint64(2), st.Commits)
	require.Equal(t, uint64(1), st.RetriedBatches)

	// A reconnected client (as after a lost connection) retries too.
	c2 := env.dial(1)
	require.NoError(t, c2.CallInto(ctx, srvCommit(ti.Table, 1, g.Epoch, 2, []uint64{5}, 2), &again))
	require.Equal(t, uint64(2), env.srv.Engine().Stats().Commits)
}

// TestServerPipelinedCommitsInOrder: many commits of one owner sent back to back on one
// connection are applied in seq order, each acknowledged.
func TestServerPipelinedCommitsInOrder(t *testing.T) {
	env := startServer(t)
	c := env.dial(1)
	ti, g := srvTable(t, c, "pipelined", 1)
	const n = 500
	errs := make(chan error, n)
	for seq := uint64(1); seq <= n; seq++ {
		m := srvCommit(ti.Table, 1, g.Epoch, seq, []uint64{seq % 64, 100}, seq)
		require.NoError(t, c.Send(srvCtx(t), m, func(f sgio.Frame, err error) { errs <- err }))
	}
	for range n {
		require.NoError(t, <-errs)
	}
	row, ok := srvReadRow(t, c, ti.Table, 100)
	require.True(t, ok)
	require.Equal(t, testkit.Row64(n), row, "the last batch in seq order wins")
}

func TestServerTLS(t *testing.T) {
	serverTLS, clientTLS := testkit.TLSConfigs(t)
	env := startServer(t, func(cfg *Config) { cfg.TLS = serverTLS })
	c := env.dial(1, func(cfg *sgio.ClientConfig) { cfg.TLS = clientTLS })
	ctx := srvCtx(t)
	ti, g := srvTable(t, c, "secure", 1)
	errs := make(chan error, 64)
	for seq := uint64(1); seq <= 64; seq++ {
		require.NoError(t, c.Send(ctx, srvCommit(ti.Table, 1, g.Epoch, seq, []uint64{seq}, seq), func(f sgio.Frame, err error) { errs <- err }))
	}
	for range 64 {
		require.NoError(t, <-errs)
	}
	row, ok := srvReadRow(t, c, ti.Table, 7)
	require.True(t, ok)
	require.Equal(t, testkit.Row64(7), row)

	// A client that does not trust the certificate fails the TLS handshake; a plain-TCP
	// client gets nowhere; a wrong secret still fails over TLS.
	_, err := env.tryDial(2, func(cfg *sgio.ClientConfig) { cfg.TLS = &tls.Config{MinVersion: tls.VersionTLS13} })
	require.ErrorContains(t, err, "certificate")
	_, err = env.tryDial(2, func(cfg *sgio.ClientConfig) { cfg.DialTimeout = 2 * time.Second })
	require.Error(t, err)
	_, err = env.tryDial(2, func(cfg *sgio.ClientConfig) { cfg.TLS = clientTLS; cfg.Secret = srvOtherSecret })
	require.ErrorIs(t, err, sgio.ErrAuthFailed)
	require.NoError(t, c.CallInto(ctx, &sgio.Ping{}, &sgio.Pong{}))
}

// TestServerOutOfOrderReplies: a read stuck on the disk does not hold back the commits and
// pings pipelined behind it on the same connection.
func TestServerOutOfOrderReplies(t *testing.T) {
	dir := coldPage(t)
	gfs := &gateFS{FS: vfs.Default}
	env := startServer(t, func(cfg *Config) { cfg.Options.Dir = dir; cfg.Options.FS = gfs })
	c := env.dial(1)
	ctx := srvCtx(t)
	var ti sgio.TableInfo
	require.NoError(t, c.CallInto(ctx, &sgio.OpenTable{Name: "cold"}, &ti))
	var g sgio.Grant
	require.NoError(t, c.CallInto(ctx, &sgio.Acquire{Table: ti.Table, Owner: 1}, &g))

	release := gfs.hold()
	defer gfs.open(release)
	readDone := make(chan error, 1)
	var got sgio.Segments
	require.NoError(t, c.Send(ctx, &sgio.ReadPages{Wants: []base.PageWant{{Table: ti.Table, Page: 0, Want: 1 << 1}}},
		func(f sgio.Frame, err error) {
			if err == nil {
				err = got.Parse(bytes.Clone(f.Body))
			}
			readDone <- err
		}))
	<-gfs.entered // the read is blocked in ReadAt
	for seq := uint64(2); seq <= 20; seq++ {
		var ack sgio.CommitAck
		require.NoError(t, c.CallInto(ctx, srvCommit(ti.Table, 1, g.Epoch, seq, []uint64{64 + seq}, seq), &ack))
		require.Equal(t, seq, ack.Seq)
	}
	require.NoError(t, c.CallInto(ctx, &sgio.Ping{}, &sgio.Pong{}))
	// A read of a cached page is answered while the other waits: replies out of order.
	row, ok := srvReadRow(t, c, ti.Table, 64+20)
	require.True(t, ok)
	require.Equal(t, testkit.Row64(20), row)
	select {
	case err := <-readDone:
		t.Fatalf("the blocked read finished before it was released: %v", err)
	default:
	}
	gfs.open(release)
	require.NoError(t, <-readDone)
	require.Equal(t, testkit.Row64(11), got.Segments[0].Rows)
}

// gateFS holds data-file reads at a gate while one is set; entered receives one value per
// held read.
type gateFS struct {
	vfs.FS
	mu      sync.Mutex
	gate    chan struct{}
	entered chan struct{}
}

func (g *gateFS) hold() chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.gate = make(chan struct{})
	g.entered = make(chan struct{}, 64)
	return g.gate
}

func (g *gateFS) open(gate chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gate == gate && gate != nil {
		close(gate)
		g.gate = nil
	}
}

func (g *gateFS) wrap(name string, f vfs.File, err error) (vfs.File, error) {
	if err != nil || !strings.HasPrefix(path.Base(name), "table-") {
		return f, err
	}
	return &gateFile{File: f, fs: g}, nil
}

func (g *gateFS) Create(name string) (vfs.File, error) {
	f, err := g.FS.Create(name)
	return g.wrap(name, f, err)
}
func (g *gateFS) Open(name string) (vfs.File, error) {
	f, err := g.FS.Open(name)
	return g.wrap(name, f, err)
}

type gateFile struct {
	vfs.File
	fs *gateFS
}

func (f *gateFile) ReadAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	gate, entered := f.fs.gate, f.fs.entered
	f.fs.mu.Unlock()
	if gate != nil {
		entered <- struct{}{}
		<-gate
	}
	return f.File.ReadAt(p, off)
}

// rawClient is a client on a bare net.Conn, for clients that misbehave.
type rawClient struct {
	t     testing.TB
	conn  net.Conn
	br    *bytesReader
	nonce [sgio.NonceSize]byte
	// transcript is Transcript of the last Hello sent and its HelloReply: the proofs cover it.
	transcript [sgio.TranscriptSize]byte
	// maxBody is the reply limit announced in Hello (1 MiB unless set).
	maxBody uint32
}

func dialRaw(t testing.TB, addr string) *rawClient {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, srvTestTimeout)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(srvTestTimeout))
	return &rawClient{t: t, conn: conn, br: newBytesReader(conn), nonce: sgio.NewNonce()}
}

// hello sends Hello as owner and returns the server's HelloReply.
func (r *rawClient) hello(owner uint64) sgio.HelloReply {
	r.t.Helper()
	maxBody := r.maxBody
	if maxBody == 0 {
		maxBody = 1 << 20
	}
	h := sgio.Hello{Version: sgio.Version, MaxBody: maxBody, OwnerID: owner, Nonce: r.nonce}
	r.send(0, &h)
	f := r.read()
	require.Equal(r.t, sgio.TypeHelloReply, f.Type)
	var hr sgio.HelloReply
	require.NoError(r.t, hr.Parse(f.Body))
	r.transcript = sgio.Transcript(&h, &hr)
	return hr
}

// srvKey is srvSecret's HMAC key.
func srvKey(t testing.TB) []byte { return secretKey(t, srvSecret) }

// secretKey is a secret's HMAC key.
func secretKey(t testing.TB, secret []byte) []byte {
	k, err := sgio.ParseSecret(secret)
	require.NoError(t, err)
	return k
}

// handshake runs the whole handshake as owner with the clients' secret, checking the
// server's proof in AuthOK.
func (r *rawClient) handshake(owner uint64) sgio.HelloReply {
	r.t.Helper()
	return r.handshakeWith(owner, srvSecret)
}

// handshakeWith is handshake with another role's secret.
func (r *rawClient) handshakeWith(owner uint64, secret []byte) sgio.HelloReply {
	r.t.Helper()
	hr := r.hello(owner)
	key := secretKey(r.t, secret)
	r.send(1, &sgio.Auth{Proof: sgio.ClientProof(key, hr.Nonce, r.nonce, r.transcript)})
	f := r.read()
	require.Equal(r.t, sgio.TypeAuthOK, f.Type, "%v", f)
	var ok sgio.AuthOK
	require.NoError(r.t, ok.Parse(f.Body))
	require.NoError(r.t, sgio.CheckServerProof(key, r.nonce, hr.Nonce, r.transcript, ok.Proof))
	return hr
}

func (r *rawClient) send(id uint64, m sgio.Message) {
	r.t.Helper()
	r.write(sgio.AppendFrame(nil, id, m))
}

func (r *rawClient) write(b []byte) {
	r.t.Helper()
	_, err := r.conn.Write(b)
	require.NoError(r.t, err)
}

// read reads one frame (its body owned).
func (r *rawClient) read() sgio.Frame {
	r.t.Helper()
	f, err := r.br.frame()
	require.NoError(r.t, err)
	return f
}

// expectError reads an Error reply to request id that carries want.
func (r *rawClient) expectError(id uint64, want error) {
	r.t.Helper()
	f := r.read()
	require.Equal(r.t, sgio.TypeError, f.Type)
	require.Equal(r.t, id, f.ID)
	var e sgio.ErrorReply
	require.NoError(r.t, e.Parse(f.Body))
	require.ErrorIs(r.t, e.Err(), want)
}

// expectClosed reads until the server closes the connection.
func (r *rawClient) expectClosed() {
	r.t.Helper()
	_, err := r.br.frame()
	require.Error(r.t, err)
	require.True(r.t, errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isReset(err), "%v", err)
}

func isReset(err error) bool { return err != nil && strings.Contains(err.Error(), "connection reset") }

// bytesReader reads whole frames from a stream.
type bytesReader struct {
	rd  io.Reader
	buf []byte
}

func newBytesReader(rd io.Reader) *bytesReader { return &bytesReader{rd: rd} }

func (b *bytesReader) frame() (sgio.Frame, error) {
	for {
		f, n, err := sgio.Decode(b.buf, sgio.MaxBodyLimit)
		if err == nil {
			f.Body = bytes.Clone(f.Body)
			b.buf = b.buf[n:]
			return f, nil
		}
		if err != sgio.ErrNeedMore {
			return sgio.Frame{}, err
		}
		chunk := make([]byte, 64<<10)
		k, rerr := b.rd.Read(chunk)
		b.buf = append(b.buf, chunk[:k]...)
		if rerr != nil {
			if rerr == io.EOF && len(b.buf) > 0 {
				rerr = io.ErrUnexpectedEOF
			}
			return sgio.Frame{}, rerr
		}
	}
}
