package node_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/etcdtest"
	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/internal/testkit"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/storenode/server"
	"github.com/weftdb/weft/txnode"
)

const prefix = "/nodetest/"

// secret is the storage nodes' shared secret (hex of 32 bytes): the cluster nodes
// authenticate as every storage node's client does.
var secret = []byte("9f1c2e3d4b5a69788796a5b4c3d2e1f00112233445566778899aabbccddeeff0")

// peerSecret and operatorSecret are the storage nodes' other roles' secrets: their
// resolvers dial each other with peerSecret, the nodes' movers with operatorSecret.
var (
	peerSecret     = []byte("0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9")
	operatorSecret = []byte("f9e8d7c6b5a4938271605f4e3d2c1b0af9e8d7c6b5a4938271605f4e3d2c1b0a")
)

// testCtx bounds every wait of a test.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	t.Cleanup(cancel)
	return ctx
}

var quiet = slog.New(slog.DiscardHandler)

// createTable creates the table name through n (rowBytes-byte rows, partitions partitions of
// stripePages pages each, on the storage nodes nodes), failing the test on error.
func createTable(t *testing.T, ctx context.Context, n *node.Node, name string, rowBytes, partitions, stripePages int, nodes []string) *node.Table {
	t.Helper()
	tbl, err := n.CreateTable(ctx, name, rowBytes, partitions, stripePages, nodes)
	require.NoError(t, err)
	return tbl
}

// insertRow inserts r into tbl, failing the test on error, and returns its id.
func insertRow(t *testing.T, ctx context.Context, tbl *node.Table, r []byte) uint64 {
	t.Helper()
	id, err := tbl.Insert(ctx, r)
	require.NoError(t, err)
	return id
}

// openTable opens the table name through n, failing the test on error.
func openTable(t *testing.T, ctx context.Context, n *node.Node, name string) *node.Table {
	t.Helper()
	tbl, err := n.OpenTable(ctx, name)
	require.NoError(t, err)
	return tbl
}

// testCluster is a real etcd and real storage nodes on 127.0.0.1, each verifying grants in
// etcd (cluster.GrantVerifier), as cmd/storenode -etcd runs them.
type testCluster struct {
	etcd  *etcdtest.Server
	c     *cluster.Client
	srvs  []*server.Server
	addrs []string
}

func startCluster(t *testing.T, storageNodes int) *testCluster {
	t.Helper()
	return startClusterVerified(t, storageNodes, func(c *cluster.Client) storenode.GrantVerifier {
		return cluster.NewGrantVerifier(c, storenode.ErrFenced)
	})
}

// startClusterVerified is startCluster whose storage nodes verify grants and move steps with
// the verifier verifier makes of the cluster's client (a flaky one, in a test).
func startClusterVerified(t *testing.T, storageNodes int, verifier func(*cluster.Client) storenode.GrantVerifier) *testCluster {
	t.Helper()
	tc := newTestCluster(t)
	v := verifier(tc.c)
	for range storageNodes {
		tc.addServer(t, storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone, GrantVerifier: v}, nil)
	}
	return tc
}

// newTestCluster starts etcd and connects the cluster's client: a testCluster with no
// storage node yet.
func newTestCluster(t *testing.T) *testCluster {
	t.Helper()
	ctx := testCtx(t)
	tc := &testCluster{etcd: etcdtest.Start(t)}
	c, err := cluster.Connect(ctx, cluster.Config{Endpoints: tc.etcd.Endpoints(), Prefix: prefix, Logger: quiet})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	tc.c = c
	return tc
}

// addServer starts a storage node of opts on 127.0.0.1 (the three roles' secrets) and adds
// it to tc; it shuts down when the test ends, then stopped, when set, runs.
func (tc *testCluster) addServer(t *testing.T, opts storenode.Options, stopped func()) {
	t.Helper()
	srv, err := server.New(server.Config{Listen: "127.0.0.1:0", Logger: quiet, EventLoops: 1, Secret: secret, PeerSecret: peerSecret, OperatorSecret: operatorSecret,
		Options: opts})
	require.NoError(t, err)
	require.NoError(t, srv.Start())
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
		if stopped != nil {
			stopped()
		}
	})
	tc.srvs = append(tc.srvs, srv)
	tc.addrs = append(tc.addrs, srv.Addr().String())
}

// open opens a cluster node of owner id owner, taking requests at addr.
func (tc *testCluster) open(t *testing.T, owner uint64, addr string) *node.Node {
	t.Helper()
	return tc.openConfig(t, node.Config{Session: cluster.SessionConfig{Owner: owner, Addr: addr}})
}

// openConfig opens a cluster node of cfg, with the cluster's etcd.
func (tc *testCluster) openConfig(t *testing.T, cfg node.Config) *node.Node {
	t.Helper()
	if cfg.Etcd.Endpoints == nil {
		cfg.Etcd.Endpoints = tc.etcd.Endpoints()
	}
	cfg.Etcd.Prefix, cfg.Etcd.Logger = prefix, quiet
	cfg.Logger = quiet
	if cfg.CacheBytes == 0 {
		cfg.CacheBytes = 1 << 20
	}
	if cfg.Secret == nil {
		cfg.Secret = secret
	}
	if cfg.OperatorSecret == nil {
		cfg.OperatorSecret = operatorSecret
	}
	n, err := node.Open(testCtx(t), cfg)
	require.NoError(t, err)
	testkit.CloseAtCleanup(t, 10*time.Second, n.Close)
	return n
}

// openNodeTable opens a node of owner with no game address (a mover's, a reader's) and its
// handle of the table name.
func (tc *testCluster) openNodeTable(t *testing.T, ctx context.Context, owner uint64, name string) (*node.Node, *node.Table) {
	t.Helper()
	n := tc.open(t, owner, "")
	return n, openTable(t, ctx, n, name)
}

func balanceRow(v uint64) []byte {
	b := make([]byte, 64)
	binary.LittleEndian.PutUint64(b, v)
	return b
}

func balanceOf(row []byte) uint64 { return binary.LittleEndian.Uint64(row) }

// requireRow reads row id of tbl into dst, failing the test on error or unless the row is
// want.
func requireRow(t *testing.T, ctx context.Context, tbl *node.Table, id uint64, dst, want []byte, msgAndArgs ...any) {
	t.Helper()
	require.NoError(t, tbl.Get(ctx, id, dst))
	require.Equal(t, want, dst, msgAndArgs...)
}

// requireBalance reads row id of tbl into dst, failing the test on error or unless the row's
// balance is want.
func requireBalance(t *testing.T, ctx context.Context, tbl *node.Table, id uint64, dst []byte, want uint64, msgAndArgs ...any) {
	t.Helper()
	require.NoError(t, tbl.Get(ctx, id, dst))
	require.Equal(t, want, balanceOf(dst), msgAndArgs...)
}

// parts returns the partitions p of n with p%2 == parity.
func parts(n, parity int) []uint32 {
	var out []uint32
	for p := parity; p < n; p += 2 {
		out = append(out, uint32(p))
	}
	return out
}

// raceOn is testkit.RaceOn, under the name move_kill_unix_test.go uses.
const raceOn = testkit.RaceOn

// ownTwoRows owns partitions 0 and 1 of tbl and inserts a row of balance 1 in each,
// returning their ids (x in partition 0, y in partition 1).
func ownTwoRows(t *testing.T, ctx context.Context, tbl *node.Table) (x, y uint64) {
	t.Helper()
	require.NoError(t, tbl.Own(ctx, 0, 1))
	ids := map[uint32]uint64{}
	for len(ids) < 2 {
		id := insertRow(t, ctx, tbl, balanceRow(1))
		ids[tbl.Partition(id)] = id
	}
	return ids[0], ids[1]
}

// ownFirstRow owns partition 0 of tbl and inserts a row of balance 1 there, failing the
// test unless the row lands in partition 0; it returns the row's id.
func ownFirstRow(t *testing.T, ctx context.Context, tbl *node.Table) uint64 {
	t.Helper()
	require.NoError(t, tbl.Own(ctx, 0))
	id := insertRow(t, ctx, tbl, balanceRow(1))
	require.EqualValues(t, 0, tbl.Partition(id))
	return id
}

// startOwnedFirst starts a cluster of two storage nodes and opens an owner node (0x1) and a
// mover node (0x2), neither with a game address; the owner creates the table name of two
// partitions and owns its first row (ownFirstRow), id.
func startOwnedFirst(t *testing.T, ctx context.Context, name string) (tc *testCluster, owner, mover *node.Node, tbl *node.Table, id uint64) {
	t.Helper()
	tc = startCluster(t, 2)
	owner = tc.open(t, 0x1, "")
	mover = tc.open(t, 0x2, "")
	tbl = createTable(t, ctx, owner, name, 64, 2, 1, tc.addrs)
	return tc, owner, mover, tbl, ownFirstRow(t, ctx, tbl)
}

// holder reads the holder of partition part of table from etcd, and whether it is held.
func (tc *testCluster) holder(t *testing.T, ctx context.Context, table string, part uint32) (cluster.Holder, bool) {
	t.Helper()
	h, held, err := tc.c.Owner(ctx, table, part)
	require.NoError(t, err)
	return h, held
}

// deleteOwnerKey deletes the owner key of partition part of table in etcd through a client of
// its own, behind every node's back.
func (tc *testCluster) deleteOwnerKey(t *testing.T, ctx context.Context, table string, part uint32) {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: tc.etcd.Endpoints(), DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	require.NoError(t, err)
	defer cli.Close()
	_, err = cli.Delete(ctx, fmt.Sprintf("%sown/%s/%08x", prefix, table, part))
	require.NoError(t, err)
}

// heldBy reads the holder of partition part of table from etcd, failing the test unless the
// partition is held.
func (tc *testCluster) heldBy(t *testing.T, ctx context.Context, table string, part uint32) cluster.Holder {
	t.Helper()
	h, held := tc.holder(t, ctx, table, part)
	require.True(t, held)
	return h
}

// placed reads etcd's map: the storage node partition part of table is placed on.
func (tc *testCluster) placed(t *testing.T, ctx context.Context, table string, part int) string {
	t.Helper()
	m, err := tc.c.ReadMap(ctx)
	require.NoError(t, err)
	return m.Tables[table].Nodes[part]
}

// moveRecorded reports whether etcd holds a move record of partition part of table.
func (tc *testCluster) moveRecorded(t *testing.T, ctx context.Context, table string, part uint32) bool {
	t.Helper()
	_, recorded, err := tc.c.ReadMove(ctx, table, part)
	require.NoError(t, err)
	return recorded
}

// dialPartition dials the storage node at addr with secret (a client's, or the operators')
// as owner owner and opens its table name (a partition's), closing the client when the test
// ends; it returns the client and the table's id there.
func dialPartition(t *testing.T, ctx context.Context, addr string, secret []byte, owner uint64, name string) (*sgio.Client, uint32) {
	t.Helper()
	cl, err := sgio.Dial(ctx, sgio.ClientConfig{Addr: addr, Secret: secret, OwnerID: owner})
	require.NoError(t, err)
	t.Cleanup(func() { cl.Close() })
	var ti sgio.TableInfo
	require.NoError(t, cl.CallInto(ctx, &sgio.OpenTable{Name: name}, &ti))
	return cl, ti.Table
}

// moveState asks cl's storage node for the move state of its table table.
func moveState(t *testing.T, ctx context.Context, cl *sgio.Client, table uint32) storenode.MoveState {
	t.Helper()
	st, err := cl.MoveStep(ctx, &sgio.Move{Op: sgio.MoveOpStatus, Table: table})
	require.NoError(t, err)
	return storenode.MoveState(st.State)
}

// onMoveStepOnce sets the move step hook to run f at the first step step of any move,
// clearing the hook when the test ends; called reports whether f ran.
func onMoveStepOnce(t *testing.T, step string, f func()) (called func() bool) {
	t.Helper()
	hooked := false
	node.SetMoveStepHook(func(s string) {
		if s != step || hooked {
			return
		}
		hooked = true
		f()
	})
	t.Cleanup(func() { node.SetMoveStepHook(nil) })
	return func() bool { return hooked }
}

// freezeHold starts a Move of partition part of mt to `to` that stops once the source is
// frozen (before the final catch-up) until release is closed or ctx ends; it returns once
// the source is frozen, and the move's result channel.
func freezeHold(t *testing.T, ctx context.Context, mt *node.Table, part uint32, to string) (release chan struct{}, moved chan error) {
	t.Helper()
	frozen := make(chan struct{})
	release = make(chan struct{})
	node.SetMoveStepHook(func(step string) {
		if step == node.MoveStepFrozen {
			close(frozen)
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
	})
	t.Cleanup(func() { node.SetMoveStepHook(nil) })
	moved = make(chan error, 1)
	go func() { moved <- mt.Move(ctx, part, to) }()
	select {
	case <-frozen:
	case err := <-moved:
		require.FailNow(t, "the move ended before its freeze", "%v", err)
	}
	return release, moved
}

// eachDurability runs f as a subtest for each durability mode: "durable" and "writeback".
func eachDurability(t *testing.T, f func(t *testing.T, mode txnode.Durability)) {
	t.Helper()
	for _, d := range []struct {
		name string
		mode txnode.Durability
	}{{"durable", txnode.Durable}, {"writeback", txnode.WriteBack}} {
		t.Run(d.name, func(t *testing.T) { f(t, d.mode) })
	}
}

// returnsWithin runs f on a goroutine of its own and fails the test with msg unless f returns
// within d.
func returnsWithin(t *testing.T, d time.Duration, msg string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		f()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatal(msg)
	}
}

// holdAtStep starts a Move of partition part of mt to `to` that stops at its step step until
// the returned release is called (at the latest when the test ends); it returns once the move
// is there, and the move's result channel. A move that ends first fails the test: "the move
// ended before " and before.
func holdAtStep(t *testing.T, ctx context.Context, mt *node.Table, part uint32, to, step, before string) (release func(), moved chan error) {
	t.Helper()
	reached, hold := make(chan struct{}), make(chan struct{})
	node.SetMoveStepHook(func(s string) {
		if s == step {
			close(reached)
			<-hold
		}
	})
	t.Cleanup(func() { node.SetMoveStepHook(nil) })
	released := false
	release = func() {
		if !released {
			released = true
			close(hold)
		}
	}
	t.Cleanup(release)
	moved = make(chan error, 1)
	go func() { moved <- mt.Move(ctx, part, to) }()
	select {
	case <-reached:
	case err := <-moved:
		t.Fatalf("the move ended before %s: %v", before, err)
	}
	return release, moved
}

// moveCutShortAt runs a Move of partition part of mt to `to` whose context ends at its step
// step (the mover dies, or its operator gives up, there), and returns the Move's error.
func moveCutShortAt(t *testing.T, ctx context.Context, mt *node.Table, part uint32, to, step string) error {
	t.Helper()
	mctx, cancel := context.WithCancel(ctx)
	defer cancel()
	node.SetMoveStepHook(func(s string) {
		if s == step {
			cancel()
		}
	})
	defer node.SetMoveStepHook(nil)
	return mt.Move(mctx, part, to)
}

// holdCoordAt sets the coordinator hook to hold the first coordinator that reaches step step
// there until release is closed or ctx ends (the hook runs on the coordinators' goroutines:
// any other passes); reached is closed once one is held. restore puts the hook back.
func holdCoordAt(ctx context.Context, step string, release <-chan struct{}) (reached chan struct{}, restore func()) {
	reached = make(chan struct{})
	var once atomic.Bool
	restore = node.SetCoordHook(func(s string, _ int) {
		if s == step && once.CompareAndSwap(false, true) {
			close(reached)
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
	})
	return reached, restore
}

// switchHold holds a Move of partition 0 of mt to `to` at its switch (before the activation):
// holdAtStep.
func switchHold(t *testing.T, ctx context.Context, mt *node.Table, to string) (release func(), moved chan error) {
	t.Helper()
	return holdAtStep(t, ctx, mt, 0, to, node.MoveStepSwitched, "its switch")
}

// holdAtFlushed holds a Move of partition 0 of mt to `to` once the owner has flushed (its
// writes of the partition held): holdAtStep.
func holdAtFlushed(t *testing.T, ctx context.Context, mt *node.Table, to string) (release func(), moved chan error) {
	t.Helper()
	return holdAtStep(t, ctx, mt, 0, to, node.MoveStepFlushed, "the owner flushed")
}

// startWithTable starts a cluster of storageNodes storage nodes and opens a node of owner at
// addr, which creates table name (64-byte rows, partitions partitions of one stripe page,
// placed over all the storage nodes).
func startWithTable(t *testing.T, ctx context.Context, storageNodes int, owner uint64, addr, name string, partitions int) (*testCluster, *node.Node, *node.Table) {
	t.Helper()
	tc := startCluster(t, storageNodes)
	n := tc.open(t, owner, addr)
	return tc, n, createTable(t, ctx, n, name, 64, partitions, 1, tc.addrs)
}

// killDBAt sets the race hook to kill n's transaction node of the storage node at addr
// (node.KillDB) the first time the race point where is reached; it returns what restores the
// hook, and fired, which reports whether the kill ran.
func killDBAt(t *testing.T, ctx context.Context, n *node.Node, addr, where string) (restore func(), fired func() bool) {
	t.Helper()
	killed := false
	restore = node.SetRaceHook(func(w string) {
		if w == where && !killed {
			killed = true
			require.NoError(t, node.KillDB(ctx, n, addr))
		}
	})
	return restore, func() bool { return killed }
}

// getPair reads rows x and y of tbl in tx (y only once x was read).
func getPair(tx *node.Tx, tbl *node.Table, x, y uint64) (a, b []byte, err error) {
	a, b = make([]byte, 64), make([]byte, 64)
	if err = tx.Get(tbl, x, a); err == nil {
		err = tx.Get(tbl, y, b)
	}
	return a, b, err
}

// etcdProxy starts a proxy to tc's etcd (one a test can cut), closed when the test ends.
func (tc *testCluster) etcdProxy(t *testing.T) *etcdtest.Proxy {
	t.Helper()
	px, err := etcdtest.NewProxy(tc.etcd.Addr())
	require.NoError(t, err)
	t.Cleanup(px.Close)
	return px
}
