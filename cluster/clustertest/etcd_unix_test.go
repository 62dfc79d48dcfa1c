//go:build unix

package clustertest_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/weftdb/weft/cluster/clustertest"
	"github.com/weftdb/weft/cluster/proctest"
	"github.com/weftdb/weft/internal/testkit"
)

// events multiplexes the stdout lines of several children for the test's goroutine.
type events struct {
	t     *testing.T
	ctx   context.Context
	ch    chan event
	alive int
	last  []string // the latest lines, for a failure's message
}

type event struct {
	who  int
	line string
	eof  bool
}

func newEvents(t *testing.T, ctx context.Context, procs ...*clustertest.NodeProc) *events {
	e := &events{t: t, ctx: ctx, ch: make(chan event, 256), alive: len(procs)}
	for i, p := range procs {
		lines := p.Lines()
		go func() {
			for l := range lines {
				select {
				case e.ch <- event{who: i, line: l}:
				case <-ctx.Done():
					return
				}
			}
			select {
			case e.ch <- event{who: i, eof: true}:
			case <-ctx.Done():
			}
		}()
	}
	return e
}

// until hands every line to fn until cond holds (checked before each line), within ctx.
func (e *events) until(what string, cond func() bool, fn func(who int, line string)) {
	e.t.Helper()
	for !cond() {
		select {
		case ev := <-e.ch:
			if ev.eof {
				e.alive--
				if e.alive < 0 {
					e.t.Fatalf("more children ended than started")
				}
				continue
			}
			e.last = append(e.last, fmt.Sprintf("%d: %s", ev.who, ev.line))
			if len(e.last) > 20 {
				e.last = e.last[1:]
			}
			fn(ev.who, ev.line)
		case <-e.ctx.Done():
			e.t.Fatalf("waiting for %s: %v; the latest lines:\n%s", what, e.ctx.Err(), strings.Join(e.last, "\n"))
		}
	}
}

// etcd itself restarted (Stop, Restart), then cut off from every node (its proxy) past the
// lease TTL, under two cluster nodes (processes) incrementing per-partition counters on
// partitions of all 3 storage nodes (processes). While etcd is away the writes go on only
// while each node can prove its lease (its deadline from the last keepalive), then fail with
// a fencing error; after the restart the same grants serve again (etcd renews the leases);
// after the cut the leases are gone, and the nodes take their partitions again under new
// sessions. It never acknowledges a write it could not prove it owned: CounterTally's check
// (every acknowledged increment in the final chain, none acknowledged twice) holds on every
// partition.
func TestEtcdRestartedUnderWrites(t *testing.T) {
	testkit.SkipUnderRace(t, "a kill suite (child processes)")
	ctx := testCtx(t, 150*time.Second)
	c := clustertest.Start(t, clustertest.Options{StorageNodes: 3})
	const parts = 6 // partition p on storage node p%3: each node writes on all three
	ids := createRows(t, c, "ctr", parts, 1, 0)
	procs := []*clustertest.NodeProc{
		c.StartNode(clustertest.NodeSpec{Owner: 0xa, Addr: "game-a:7000", Workload: clustertest.WorkloadCounter,
			Table: "ctr", Parts: parity(parts, 0), Rows: ids, Reown: true}),
		c.StartNode(clustertest.NodeSpec{Owner: 0xb, Addr: "game-b:7000", Workload: clustertest.WorkloadCounter,
			Table: "ctr", Parts: parity(parts, 1), Rows: ids, Reown: true}),
	}
	lease := make([]int64, len(procs))
	for i, p := range procs {
		l, err := strconv.ParseInt(clustertest.Fields(p.Ready())[1], 10, 64)
		require.NoError(t, err)
		lease[i] = l
	}
	ev := newEvents(t, ctx, procs...)
	tally := clustertest.NewCounterTally()
	acks, fails, reopens := make([]int, len(procs)), make([]int, len(procs)), make([]int, len(procs))
	// out: the node's lines are of the outage. It starts when etcd goes away (a line read
	// then may be older: judged as of the outage, the stricter) and ends, for each node, at
	// the marker put in its lines (StopMarked) while it was stopped for etcd's return: every
	// line before it was printed before etcd came back.
	out := make([]bool, len(procs))
	var outageAcks, recovering int
	// marked: the node answered the "mark" sent once etcd went away (every line after it was
	// printed during the outage); lapsed: it then failed for want of a proven lease. A node
	// whose lease lapsed cannot prove it again before etcd is back: an acknowledged write
	// then is one it could not prove it owned.
	marked, lapsed := make([]bool, len(procs)), make([]bool, len(procs))
	record := func(who int, line string) {
		if strings.HasPrefix(line, proctest.MarkerPrefix) {
			out[who] = false
			return
		}
		cl, err := tally.Add(line)
		require.NoError(t, err)
		switch cl.Kind {
		case "ok":
			acks[who]++
			if out[who] {
				outageAcks++
				require.False(t, lapsed[who], "node %d acknowledged a write after its lease lapsed, etcd unreachable: %s", who, line)
			}
		case "mark":
			marked[who] = out[who]
		case "err":
			fails[who]++
			if out[who] && marked[who] {
				// A clear error: the lease could not be proven, or etcd was unreachable.
				require.Contains(t, []string{"expired", "lapsed", "lost", "notowner", "unavailable", "unverified"}, cl.Class,
					"node %d's write failed with etcd away, but not saying why: %s", who, line)
				lapsed[who] = lapsed[who] || cl.Class == "expired" || cl.Class == "lapsed"
			}
			if !out[who] {
				recovering++ // with etcd back, until the node proved its lease or took its partitions again
			}
		case "reopen":
			reopens[who]++
			lease[who], err = strconv.ParseInt(clustertest.Fields(line)[1], 10, 64)
			require.NoError(t, err)
		}
	}
	// grownFrom waits until every node's count is past snap by n; grown from the counts now.
	grownFrom := func(what string, count, snap []int, n int) {
		t.Helper()
		ev.until(what, func() bool {
			for i := range count {
				if count[i] < snap[i]+n {
					return false
				}
			}
			return true
		}, record)
	}
	grown := func(what string, count []int, n int) {
		t.Helper()
		grownFrom(what, count, slices.Clone(count), n)
	}
	grown("first writes", acks, 5)

	// 1. etcd stopped (a crash: no lease expires meanwhile) and started again.
	startOutage := func() {
		for i, p := range procs {
			out[i] = true
			marked[i], lapsed[i] = false, false
			require.NoError(t, p.Send("mark"))
		}
	}
	// endOutage gives etcd back (back) with every node stopped, a marker in its lines: the
	// outage's lines end there, node by node (record).
	endOutage := func(back func()) {
		t.Helper()
		for _, p := range procs {
			_, err := p.StopMarked(ctx)
			if errors.Is(err, errors.ErrUnsupported) {
				t.Skip(err)
			}
			require.NoError(t, err)
		}
		back()
		for _, p := range procs {
			p.Cont()
		}
		ev.until("the outage's last lines", func() bool { return !slices.Contains(out, true) }, record)
	}
	c.Etcd.Stop()
	startOutage()
	grown("writes failing with etcd stopped", fails, 1)
	ev.until("the nodes' leases lapsing", func() bool { return lapsed[0] && lapsed[1] }, record)
	// The counts from before etcd's return: endOutage reads on to every node's marker, past
	// the first lines after it of the nodes it reached first.
	snap := slices.Clone(acks)
	endOutage(func() { require.NoError(t, c.Etcd.Restart()) })
	grownFrom("writes after etcd restarted", acks, snap, 5)
	t.Logf("etcd restart: %d writes acknowledged while it was down (each within its node's proven lease); failures %v", outageAcks, tally.Errs)
	t.Logf("%d failures after etcd came back, before the nodes recovered", recovering)

	// 2. etcd cut off from every node past the TTL: it expires the leases.
	observer, err := clientv3.New(clientv3.Config{Endpoints: c.Etcd.ServerEndpoints(), DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	require.NoError(t, err)
	defer observer.Close()
	outageAcks = 0
	c.Etcd.Cut(true)
	startOutage()
	ev.until("the nodes' leases lapsing", func() bool { return lapsed[0] && lapsed[1] }, record)
	for i := range procs {
		waitLeaseGone(t, ctx, observer, lease[i])
	}
	snap = slices.Clone(reopens)
	endOutage(func() { c.Etcd.Cut(false) })
	grownFrom("nodes taking their partitions again", reopens, snap, 1)
	grown("writes under the new grants", acks, 5)
	t.Logf("etcd cut: %d writes acknowledged while cut off; failures %v", outageAcks, tally.Errs)

	for _, p := range procs {
		require.NoError(t, p.CloseInput())
	}
	ev.until("the nodes' ends", func() bool { return ev.alive == 0 }, record)
	for _, p := range procs {
		require.NoError(t, p.Wait(ctx))
	}

	r, err := c.OpenNode(0xc, "").OpenTable(ctx, "ctr")
	require.NoError(t, err)
	for p, id := range ids {
		final := readU64(t, ctx, r, id)
		require.NoError(t, tally.Check(uint32(p), final))
		require.NotZero(t, final)
	}
}

// waitLeaseGone waits until etcd no longer has lease: expired (asking every 100 ms, a
// condition polled within ctx). TimeToLive's TTL is whole seconds, truncated: 0 is a lease
// with less than a second left (a keepalive then still renews it: cluster.Client.LeaseAlive,
// conservative, calls it dead) as well as one expired under a second ago; -1 is one not
// found, or expired a second or more ago, which no keepalive renews.
func waitLeaseGone(t *testing.T, ctx context.Context, c *clientv3.Client, lease int64) {
	t.Helper()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		resp, err := c.TimeToLive(ctx, clientv3.LeaseID(lease))
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return
		}
		require.NoError(t, err)
		if resp.TTL < 0 {
			return
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("lease %x still alive: %v", lease, ctx.Err())
		}
	}
}
