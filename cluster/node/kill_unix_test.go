//go:build unix

package node_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/testkit"
)

// killHelperEnv carries "etcd endpoint|account ids, comma-separated" to TestHelperBankNode.
const killHelperEnv = "WEFT_NODE_KILL_HELPER"

// TestHelperBankNode is the child of TestKilledNodeTakenOver (it does nothing unless started
// by it): a cluster node owning the even partitions of "acct" under a session of the shortest
// TTL, moving money between the given accounts (pairs on one storage node) for ever. Before
// each transfer it prints "try FROM TO AMOUNT", after it returned nil "ok".
func TestHelperBankNode(t *testing.T) {
	spec := testkit.HelperSpec(t, killHelperEnv, "TestKilledNodeTakenOver")
	endpoint, list, _ := strings.Cut(spec, "|")
	ids := parseIDs(t, list)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	n := openHelperNode(t, ctx, endpoint, 0xa, "game-a:7000")
	tbl := openTable(t, ctx, n, "acct")
	require.NoError(t, tbl.OwnWait(ctx, parts(partitions, 0)...))
	fmt.Println("ready")
	rng := rand.New(rand.NewPCG(7, 7))
	for ctx.Err() == nil {
		from, to := ids[rng.IntN(len(ids))], ids[rng.IntN(len(ids))]
		if from == to || tbl.NodeOf(from) != tbl.NodeOf(to) {
			continue
		}
		amount := uint64(1 + rng.IntN(20))
		fmt.Printf("try %d %d %d\n", from, to, amount)
		if err := transfer(ctx, n, tbl, from, to, amount); err != nil {
			fmt.Printf("err %v\n", err)
			return
		}
		fmt.Println("ok")
	}
}

// A cluster node killed with -9 in the middle of its transfers: the other node takes its
// partitions once its lease expired (OwnWait) and finds every acknowledged transfer, and at
// most the one in flight besides, each whole; it continues; the total is conserved.
func TestKilledNodeTakenOver(t *testing.T) {
	testkit.SkipUnderRace(t, "a kill suite (child processes)")
	ctx := testCtx(t)
	acks := 80
	if testing.Short() {
		acks = 25
	}
	tc := startCluster(t, 3)
	ids, model := seedAccounts(t, ctx, tc, 24, balanceRow(initial))

	child := startHelper(t, "TestHelperBankNode", killHelperEnv+"="+tc.etcd.Endpoints()[0]+"|"+strings.Join(ids, ","), "ready")
	next := func() string {
		t.Helper()
		return child.Line(ctx) // fails the test once the child exited or ctx ended
	}
	apply := func(m map[uint64]uint64, x tryLine) {
		if m[x.from] >= x.amount {
			m[x.from] -= x.amount
			m[x.to] += x.amount
		}
	}
	var inflight *tryLine
	// Until acks transfers are acknowledged and the next one has begun: the kill lands
	// while a transfer is in flight (before, during or after its commit).
	for done := 0; done < acks || inflight == nil; {
		l := next()
		switch {
		case strings.HasPrefix(l, "try "):
			inflight = parseTry(t, l)
		case l == "ok":
			require.NotNil(t, inflight)
			apply(model, *inflight)
			inflight = nil
			done++
		default:
			t.Fatalf("child: %s", l)
		}
	}
	child.Kill() // SIGKILL, and waits for the exit
	// What the child printed before it died: an "ok" is an acknowledged transfer.
	for l := range child.Lines() {
		switch {
		case strings.HasPrefix(l, "try "):
			inflight = parseTry(t, l)
		case l == "ok" && inflight != nil:
			apply(model, *inflight)
			inflight = nil
		}
	}

	b := tc.open(t, 0xb, "game-b:7000")
	tb := openTable(t, ctx, b, "acct")
	require.NoError(t, tb.OwnWait(ctx, parts(partitions, 0)...), "b takes the killed node's partitions")
	got := balancesConserved(t, ctx, tb, model)
	if inflight != nil {
		with := maps.Clone(model)
		apply(with, *inflight)
		if !maps.Equal(got, model) {
			require.Equal(t, with, got, "every acknowledged transfer, and the one in flight whole or not at all")
		}
	} else {
		require.Equal(t, model, got, "every acknowledged transfer")
	}
	// b continues on the accounts.
	for id := range model {
		for id2 := range model {
			if id != id2 && tb.NodeOf(id) == tb.NodeOf(id2) {
				require.NoError(t, transfer(ctx, b, tb, id, id2, 1))
			}
		}
		break
	}
}
