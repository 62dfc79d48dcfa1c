//go:build unix

package node_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/cluster/proctest"
	"github.com/weftdb/weft/internal/testkit"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/storenode/server"
)

// The child processes of this package's kill and freeze tests, on package proctest (each a
// re-executed test binary, killed with -9, frozen, restarted; none outlives its test): the
// storage node of TestHelperStorageNode (storeProc), and the cluster nodes each kill test
// runs (startHelper).

// storeHelperEnv carries "etcd endpoint|data dir|listen address|mode" to
// TestHelperStorageNode; mode is storeTwoPhase or storeGrants.
const storeHelperEnv = "WEFT_NODE_STORE_HELPER"

const (
	// storeTwoPhase wires the storage node for two-phase commit: etcd as grant verifier and
	// lease checker, a peer to reach the other storage nodes, a resolver (after 200 ms, every
	// 100 ms).
	storeTwoPhase = "2pc"
	// storeGrants verifies grants in etcd only (no lease checker, no peer, no resolver).
	storeGrants = "grants"
)

// TestHelperStorageNode is a storage node in a child process of this package's kill and
// freeze tests (it does nothing unless started by storeProc): it serves the data dir on the
// listen address (127.0.0.1:0 for a fresh port), prints "listening ADDR" once it listens and
// then, for each line "resolve" on stdin, runs one resolver pass and prints "parts N" (the
// parts it keeps). It exits when stdin closes.
func TestHelperStorageNode(t *testing.T) {
	spec := testkit.HelperSpec(t, storeHelperEnv, "this package's kill and freeze tests")
	f := strings.Split(spec, "|")
	require.Len(t, f, 4, spec)
	ctx, cancel := context.WithTimeout(context.Background(), 110*time.Second)
	defer cancel()
	c, err := cluster.Connect(ctx, cluster.Config{Endpoints: []string{f[0]}, Prefix: prefix, Logger: quiet})
	require.NoError(t, err)
	defer c.Close()
	opts := storenode.Options{Dir: f[1], Sync: storenode.SyncNone, GrantVerifier: cluster.NewGrantVerifier(c, storenode.ErrFenced)}
	switch f[3] {
	case storeTwoPhase:
		peer := server.NewTxnPeer(server.PeerConfig{Secret: peerSecret, Directory: c})
		defer peer.Close()
		opts.LeaseChecker, opts.TxnPeer = c, peer
		opts.TxnResolveAfter, opts.TxnResolveInterval = 200*time.Millisecond, 100*time.Millisecond
	case storeGrants:
	default:
		t.Fatalf("unknown mode %q", f[3])
	}
	srv, err := server.New(server.Config{Listen: f[2], Logger: quiet, EventLoops: 1, Secret: secret, PeerSecret: peerSecret, OperatorSecret: operatorSecret, Options: opts})
	require.NoError(t, err)
	require.NoError(t, srv.Start())
	proctest.Printf("listening %s", srv.Addr())
	for cmd := range proctest.ChildInput() {
		if cmd == "resolve" {
			if err := srv.Engine().ResolveTxns(ctx); err != nil {
				proctest.Printf("err %v", err)
			}
			p, _ := srv.Engine().TxnCounts()
			proctest.Printf("parts %d", p)
		}
	}
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	srv.Shutdown(sctx)
}

// storeProc is a storage node in a child process (TestHelperStorageNode), killed with -9
// and restarted at its address over its directory. One goroutine drives it (the test's).
type storeProc struct {
	t                   *testing.T
	endpoint, dir, mode string
	// Addr is the address it listens on (the same across restarts).
	Addr string
	*proctest.Proc
}

// startStoreProc starts a storage node child over a fresh directory on listen (127.0.0.1:0
// for a fresh port) and waits until it listens.
func startStoreProc(t *testing.T, endpoint, listen, mode string) *storeProc {
	t.Helper()
	s := &storeProc{t: t, endpoint: endpoint, dir: t.TempDir(), mode: mode}
	s.start(listen)
	return s
}

func (s *storeProc) start(listen string) {
	s.t.Helper()
	s.Proc = proctest.Start(s.t, proctest.Spec{Name: "storage node", Test: "TestHelperStorageNode",
		Env:   []string{storeHelperEnv + "=" + strings.Join([]string{s.endpoint, s.dir, listen, s.mode}, "|")},
		Ready: "listening ", Timeout: 2 * time.Minute})
	addr := strings.TrimPrefix(s.Ready(), "listening ")
	if s.Addr != "" {
		require.Equal(s.t, s.Addr, addr, "restarted on its address")
	}
	s.Addr = addr
}

// restart kills the child with SIGKILL (a crash: nothing flushed) and starts it again at its
// address over its directory.
func (s *storeProc) restart() {
	s.t.Helper()
	s.Kill()
	s.start(s.Addr)
}

// resolve runs one resolver pass in the child and returns the parts it keeps.
func (s *storeProc) resolve(ctx context.Context) int {
	s.t.Helper()
	var n int
	l := s.Ask(ctx, "resolve")
	_, err := fmt.Sscanf(l, "parts %d", &n)
	require.NoError(s.t, err, "child: %s", l)
	return n
}

// startHelper starts the helper test run (a cluster node of a kill test) in a child with
// env (KEY=VALUE) and, when ready is set, waits for its first line with that prefix
// (proctest.Proc.Ready).
func startHelper(t *testing.T, run, env, ready string) *proctest.Proc {
	t.Helper()
	return proctest.Start(t, proctest.Spec{Name: run, Test: run, Env: []string{env}, Ready: ready, Timeout: 2 * time.Minute})
}

// lineOrExit returns p's next line with prefix (the lines before it dropped), "" once the
// child exited first; it fails the test when ctx ends first.
func lineOrExit(t *testing.T, ctx context.Context, p *proctest.Proc, prefix string) string {
	t.Helper()
	for {
		l, err := p.Next(ctx)
		if errors.Is(err, proctest.ErrExited) {
			return ""
		}
		require.NoError(t, err, "no answer from the child")
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
}

// killedBySIGKILL reports whether a child's exit error (proctest.Proc.Wait) is a death by
// SIGKILL.
func killedBySIGKILL(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// openHelperNode opens, in a helper child, the cluster node of owner (its session's address
// addr, "" for none) under a session of the shortest TTL, so that a killed child's lease
// ends soon.
func openHelperNode(t *testing.T, ctx context.Context, endpoint string, owner uint64, addr string) *node.Node {
	t.Helper()
	n, err := node.Open(ctx, node.Config{Logger: quiet, Secret: secret, OperatorSecret: operatorSecret,
		Etcd:    cluster.Config{Endpoints: []string{endpoint}, Prefix: prefix, Logger: quiet},
		Session: cluster.SessionConfig{Owner: owner, Addr: addr, TTL: cluster.TTLMin}})
	require.NoError(t, err)
	return n
}

// parseIDs parses a helper spec's comma-separated row ids.
func parseIDs(t *testing.T, list string) []uint64 {
	t.Helper()
	var ids []uint64
	for _, f := range strings.Split(list, ",") {
		id, err := strconv.ParseUint(f, 10, 64)
		require.NoError(t, err, list)
		ids = append(ids, id)
	}
	return ids
}

// seedAccounts creates table "acct" (partitions partitions of one page) through a setup node
// of owner 0x5e that owns the even partitions, inserts accounts rows r (of balance initial)
// there and closes the node, releasing the partitions. It returns the rows' ids in decimal
// (for a helper's spec) and the model: id -> balance.
func seedAccounts(t *testing.T, ctx context.Context, tc *testCluster, accounts int, r []byte) (ids []string, model map[uint64]uint64) {
	t.Helper()
	setup := tc.open(t, 0x5e, "")
	tbl := createTable(t, ctx, setup, "acct", 64, partitions, 1, tc.addrs)
	require.NoError(t, tbl.Own(ctx, parts(partitions, 0)...))
	model = map[uint64]uint64{}
	for range accounts {
		id := insertRow(t, ctx, tbl, r)
		ids = append(ids, strconv.FormatUint(id, 10))
		model[id] = initial
	}
	require.NoError(t, setup.Close(ctx))
	return ids, model
}

// tryLine is a transfer a helper child announced: "try FROM TO AMOUNT".
type tryLine struct{ from, to, amount uint64 }

// parseTry parses a child's "try FROM TO AMOUNT" line l.
func parseTry(t *testing.T, l string) *tryLine {
	t.Helper()
	var x tryLine
	_, err := fmt.Sscanf(l, "try %d %d %d", &x.from, &x.to, &x.amount)
	require.NoError(t, err)
	return &x
}

// balancesConserved reads the balance of every account of model through tb and fails the
// test unless they add up to the accounts' initial total; it returns them: id -> balance.
func balancesConserved(t *testing.T, ctx context.Context, tb *node.Table, model map[uint64]uint64) map[uint64]uint64 {
	t.Helper()
	got := map[uint64]uint64{}
	dst := make([]byte, 64)
	var sum uint64
	for id := range model {
		require.NoError(t, tb.Get(ctx, id, dst))
		got[id] = balanceOf(dst)
		sum += got[id]
	}
	require.Equal(t, uint64(len(model))*initial, sum, "the total is conserved")
	return got
}
