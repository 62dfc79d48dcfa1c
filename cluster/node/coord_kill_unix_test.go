//go:build unix

package node_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/cluster/proctest"
	"github.com/weftdb/weft/internal/testkit"
	"github.com/weftdb/weft/storenode"
)

// coordHelperEnv carries "etcd endpoint|step|k|owner id|account ids, comma-separated" to
// TestHelperCoordNode.
const coordHelperEnv = "WEFT_COORD_KILL_HELPER"

// TestHelperCoordNode is the child of TestCoordinatorKilledAtEachStep (it does nothing
// unless started by it): a cluster node (a fresh owner id each round: a killed one stays in
// use at the storage nodes for a lease) owning the even partitions of "acct", which prints
// its lease id, makes three transfers across storage nodes ("try FROM TO AMOUNT", then "ok"),
// then a fourth, during which it kills itself with SIGKILL at the step named (the
// coordinator's step hook: "prepared" after k prepares answered, "prepared-all", "decided",
// "applied" after k applies answered), printing "kill" first.
func TestHelperCoordNode(t *testing.T) {
	spec := testkit.HelperSpec(t, coordHelperEnv, "TestCoordinatorKilledAtEachStep")
	f := strings.Split(spec, "|")
	endpoint, step := f[0], f[1]
	k, err := strconv.Atoi(f[2])
	require.NoError(t, err)
	owner, err := strconv.ParseUint(f[3], 10, 64)
	require.NoError(t, err)
	ids := parseIDs(t, f[4])
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	n := openHelperNode(t, ctx, endpoint, owner, "game-a:7000")
	tbl := openTable(t, ctx, n, "acct")
	require.NoError(t, tbl.OwnWait(ctx, parts(partitions, 0)...))
	fmt.Printf("lease %d\n", n.Session().Lease())
	armed := false
	node.SetCoordHook(func(s string, i int) {
		if armed && s == step && i == k {
			fmt.Println("kill")
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		}
	})
	var pairs [][2]uint64
	for _, a := range ids {
		for _, b := range ids {
			if tbl.NodeOf(a) != tbl.NodeOf(b) {
				pairs = append(pairs, [2]uint64{a, b})
			}
		}
	}
	for i := range 4 {
		pr := pairs[(i*7)%len(pairs)]
		amount := uint64(10 + i)
		armed = i == 3
		fmt.Printf("try %d %d %d\n", pr[0], pr[1], amount)
		if err := xfer(ctx, n, tbl, pr[0], pr[1], amount); err != nil {
			fmt.Printf("err %v\n", err)
			return
		}
		fmt.Println("ok")
	}
	fmt.Println("err the step was never reached")
}

// The coordinator killed with -9 at each step of the two-phase commit, a child process
// each time: after 1 of 2 prepares answered, after both before the Decide, after the Decide
// before any Apply, after one of the two Applies. Once its lease is gone (revoked here: what
// etcd does one TTL after the last keepalive), the storage nodes' resolvers (one pass at a
// time, TxnResolveInterval negative) finish the transaction: no part is left prepared, the
// total is conserved, the three acknowledged transfers are there, and the one in flight is
// whole exactly when the primary had recorded commit (killed after the Decide), absent
// otherwise, never half applied. Another node then owns the partitions and goes on.
func TestCoordinatorKilledAtEachStep(t *testing.T) {
	testkit.SkipUnderRace(t, "a kill suite (child processes)")
	ctx := testCtx(t)
	tc := startTxnCluster(t, 3, func(o *storenode.Options) {
		o.TxnResolveInterval = -1 // the test runs the passes
		o.TxnResolveAfter = time.Millisecond
	})
	ids, model := seedAccounts(t, ctx, tc, 12, acctRow(initial, 0))
	etcd, err := clientv3.New(clientv3.Config{Endpoints: tc.etcd.Endpoints(), DialTimeout: 5 * time.Second, Logger: nil})
	require.NoError(t, err)
	defer etcd.Close()

	apply := func(m map[uint64]uint64, x tryLine) {
		amt := min(x.amount, m[x.from])
		m[x.from] -= amt
		m[x.to] += amt
	}
	steps := []struct {
		step      string
		k         int
		committed bool
	}{
		{"prepared", 1, false},
		{"prepared-all", 2, false},
		{"decided", 0, true},
		{"applied", 1, true},
	}
	for round, s := range steps {
		t.Logf("round %d: killed at %s %d", round, s.step, s.k)
		child := startHelper(t, "TestHelperCoordNode", fmt.Sprintf("%s=%s|%s|%d|%d|%s", coordHelperEnv, tc.etcd.Endpoints()[0], s.step, s.k, 0xa0+round, strings.Join(ids, ",")), "lease ")
		lease, err := strconv.ParseInt(strings.TrimPrefix(child.Ready(), "lease "), 10, 64)
		require.NoError(t, err)
		var inflight *tryLine
		killed := false
		for {
			l, err := child.Next(ctx)
			if errors.Is(err, proctest.ErrExited) {
				break // every line it printed was read
			}
			require.NoError(t, err, "no answer from the child")
			switch {
			case strings.HasPrefix(l, "try "):
				inflight = parseTry(t, l)
			case l == "ok":
				require.NotNil(t, inflight)
				apply(model, *inflight)
				inflight = nil
			case l == "kill":
				killed = true
			case strings.HasPrefix(l, "err "):
				t.Fatalf("child: %s", l)
			}
		}
		werr := child.Wait(ctx)
		require.True(t, killed, "the child reached the step (exit: %v)", werr)
		require.True(t, killedBySIGKILL(werr), "the child killed itself at the step: %v", werr)
		require.NotNil(t, inflight)
		require.NotZero(t, lease)

		// The lease ends (etcd would expire it one TTL after the last keepalive).
		_, err = etcd.Revoke(ctx, clientv3.LeaseID(lease))
		require.NoError(t, err)
		resolveAll(t, ctx, tc)

		if s.committed {
			apply(model, *inflight)
		}
		b := tc.open(t, 0xb0+uint64(round), "game-b:7000")
		tb := openTable(t, ctx, b, "acct")
		require.NoError(t, tb.OwnWait(ctx, parts(partitions, 0)...), "the partitions are granted again once resolved")
		got := balancesConserved(t, ctx, tb, model)
		require.True(t, maps.Equal(model, got), "round %d (%s): every acknowledged transfer, the one in flight committed=%v: want %v, got %v",
			round, s.step, s.committed, model, got)
		// The node goes on across storage nodes, then gives the partitions back.
		var from, to uint64
		for id := range model {
			for id2 := range model {
				if tb.NodeOf(id) != tb.NodeOf(id2) {
					from, to = id, id2
				}
			}
		}
		require.NoError(t, xfer(ctx, b, tb, from, to, 1))
		apply(model, tryLine{from, to, 1})
		require.NoError(t, b.Close(ctx))
	}
}

// resolveAll runs resolver passes on every storage node until none keeps a part of a
// transaction (prepared, or applied and not reported), at most a bounded number. (A
// primary keeps an abort a resolver recorded, which knows no participant count, for
// TxnAbortKeep: decisions are not counted.)
func resolveAll(t *testing.T, ctx context.Context, tc *testCluster) {
	t.Helper()
	for pass := 0; ; pass++ {
		left := 0
		for _, srv := range tc.srvs {
			e := srv.Engine()
			require.NoError(t, e.ResolveTxns(ctx))
			p, _ := e.TxnCounts()
			left += p
		}
		if left == 0 {
			return
		}
		require.Less(t, pass, 50, "transactions left in doubt: %d", left)
	}
}
