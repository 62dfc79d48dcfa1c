//go:build unix

package clustertest_test

import (
	"context"
	"maps"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/clustertest"
	"github.com/weftdb/weft/internal/testkit"
)

// The bank, end to end: 3 storage-node processes, 2 cluster-node processes making
// transfers across storage nodes (accounts in every partition, each transfer one transaction
// with its log row). Each round, one coordinator kills itself with -9 at a step of the
// two-phase commit (after 1 prepare answered, after all before the Decide, after the Decide
// before any Apply, after 1 Apply: KillAt), in turn; then a storage node is killed with -9
// and restarted while the other coordinator goes on; then the killed coordinator is started
// again (a new session). Nothing is done by hand: the dead session's lease expires in etcd by
// its TTL, the storage nodes' resolvers (a short TxnResolveAfter) finish its in-doubt
// transaction, and the new session's OwnWait gets the partitions once they are. At the end,
// once every storage node keeps no transaction part and no decision (TxnCounts: every
// in-doubt transaction resolved, none left prepared), the durable rows show the total
// conserved, every acknowledged transfer's log row, and every balance equal to its opening
// value plus the transfers whose log rows are there (none half applied, the crashed ones
// included: whole or absent). WEFT_SOAK=1 runs it longer.
func TestBankCoordinatorAndStorageNodeKilled(t *testing.T) {
	testkit.SkipUnderRace(t, "a kill suite (child processes)")
	rounds, perPart, acksPerPhase := 4, 2, 10
	if os.Getenv("WEFT_SOAK") == "1" {
		rounds, perPart, acksPerPhase = 16, 6, 60
	}
	steps := []struct {
		step string
		i    int
	}{{"prepared", 1}, {"prepared-all", 2}, {"decided", 0}, {"applied", 1}}
	ctx := testCtx(t, 60*time.Second+time.Duration(rounds)*25*time.Second)
	c := clustertest.Start(t, clustertest.Options{StorageNodes: 3, TxnResolveAfter: 300 * time.Millisecond})
	const parts, initial = 12, 1000 // p on storage node p%3: each cluster node owns two partitions on every one
	accts := createRows(t, c, "acct", parts, perPart, initial)
	createRows(t, c, "xlog", parts, 0, 0)
	layout := cluster.Layout{Partitions: parts, StripePages: 1}
	nodeOf := func(id uint64) string { return c.Addrs()[layout.Of(id)%3] }

	// An incarnation is one cluster-node process: side 0 or 1 (its partitions), its owner id.
	type incarnation struct {
		p     *clustertest.NodeProc
		side  int
		owner uint64
		alive bool
		kill  string // the "kill" line it printed
	}
	var incs []*incarnation
	mux := newMux(ctx)
	start := func(side int) {
		t.Helper()
		owner := uint64(0xa0+0x10*len(incs)) + uint64(side)
		p := c.StartNode(clustertest.NodeSpec{Owner: owner, Addr: []string{"game-a:7000", "game-b:7000"}[side],
			Workload: clustertest.WorkloadBank, Table: "acct", LogTable: "xlog", Parts: parity(parts, side),
			Rows: accts, CrossNode: crossNode, Seed: uint64(len(incs) + 1), Reown: true})
		incs = append(incs, &incarnation{p: p, side: side, owner: owner, alive: true})
		mux.add(len(incs)-1, p)
	}
	start(0)
	start(1)
	live := [2]int{0, 1} // each side's running incarnation

	type xfer struct {
		who      int
		seq, log uint64
		hasLog   bool
		logs     []uint64 // every run's log row id ("log" lines)
		from, to uint64
		amount   uint64
		state    string // acked, failed, crashed: for a failure's report
		found    bool   // its log row is there
	}
	tries := map[[2]uint64]*xfer{} // by incarnation, seq
	var acked, failed []*xfer
	acks := 0
	acksOn, classes := map[string]int{}, map[string]int{}
	touched := map[string]int{} // transfers tried with an account on the storage node
	kills := map[string]int{}
	record := func(who int, line string) {
		f := clustertest.Fields(line)
		num := fieldNum(t, line, f)
		key := func() [2]uint64 { return [2]uint64{uint64(who), num(1)} }
		switch f[0] {
		case "try":
			tries[key()] = &xfer{who: who, seq: num(1), from: num(2), to: num(3), amount: num(4)}
			touched[nodeOf(num(2))]++
			if nodeOf(num(3)) != nodeOf(num(2)) {
				touched[nodeOf(num(3))]++
			}
		case "log":
			x := tries[key()]
			require.NotNil(t, x, "a log line with no try: %s", line)
			x.logs = append(x.logs, num(2))
		case "kill":
			incs[who].kill = line
			kills[f[1]]++
		case "ok", "err":
			x := tries[key()]
			require.NotNil(t, x, "an answer with no try: %s", line)
			delete(tries, key())
			if x.hasLog = f[2] != "-"; x.hasLog {
				x.log = num(2)
			}
			if f[0] == "ok" {
				acked = append(acked, x)
				acks++
				acksOn[nodeOf(x.from)]++
			} else {
				failed = append(failed, x)
				classes[f[3]]++
				t.Logf("failed: %+v (owner %x): %s", *x, incs[who].owner, line)
			}
		}
	}
	until := func(what string, cond func() bool) {
		t.Helper()
		mux.until(t, what, cond, record, func(who int) { incs[who].alive = false })
	}
	progress := func(what string, count func() int, n int) {
		t.Helper()
		want := count() + n
		until(what, func() bool { return count() >= want })
	}

	progress("transfers", func() int { return acks }, acksPerPhase)
	for r := range rounds {
		st := steps[r%len(steps)]
		side := r % 2
		v := incs[live[side]]
		t.Logf("round %d: coordinator %x killed at %s %d, storage node %d killed", r, v.owner, st.step, st.i, r%3)
		require.NoError(t, v.p.KillAt(st.step, st.i))
		until("the coordinator's crash at "+st.step, func() bool { return !v.alive })
		require.NotEmpty(t, v.kill, "coordinator %x ended without reaching %s %d", v.owner, st.step, st.i)
		require.Error(t, v.p.Wait(ctx), "killed")

		// A storage node killed while the other side's transfers go on; restarted while they
		// wait for it.
		other := incs[live[1-side]]
		s := c.Storage[r%len(c.Storage)]
		s.Kill()
		want := touched[s.Addr] + 1
		until("a transfer tried on the killed storage node", func() bool { return touched[s.Addr] >= want || !other.alive })
		require.True(t, other.alive, "the other coordinator ended")
		s.Restart()

		// The crashed coordinator again, a new session: its OwnWait waits out the dead lease
		// (its TTL in etcd) and the resolution of its in-doubt transaction.
		start(side)
		live[side] = len(incs) - 1
		progress("transfers after the round", func() int { return acksOn[s.Addr] }, acksPerPhase/2)
	}
	for _, i := range live {
		require.NoError(t, incs[i].p.CloseInput())
	}
	until("the nodes' ends", func() bool { return !incs[live[0]].alive && !incs[live[1]].alive })
	for _, i := range live {
		require.NoError(t, incs[i].p.Wait(ctx))
	}
	for _, st := range steps[:min(rounds, len(steps))] {
		require.NotZero(t, kills[st.step], "a coordinator killed at %s", st.step)
	}
	t.Logf("%d transfers acknowledged, %d failed (%v), %d crashed in flight, coordinator kills %v",
		len(acked), len(failed), classes, len(tries), kills)

	// Every in-doubt transaction resolved: no storage node keeps a part, prepared or applied
	// and not yet reported to its primary (a commit's decision is forgotten once every part
	// reported; an abort may be kept, storenode.Options.TxnAbortKeep).
	waited := time.Now()
	for _, s := range c.Storage {
		for {
			p, d := s.TxnCounts(ctx)
			if p == 0 {
				t.Logf("storage node %d: no part left (%d aborts kept)", s.Index, d)
				break
			}
			select { // polling a child's counters: the resolver's period, bounded by ctx
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
				t.Fatalf("storage node %d: %d transaction parts and %d decisions left: %v", s.Index, p, d, ctx.Err())
			}
		}
	}
	t.Logf("resolved %v after the nodes' ends", time.Since(waited).Round(time.Millisecond))

	rt, lt := openBankReader(t, ctx, c)
	buf := make([]byte, lt.RowBytes())
	// logged returns the log row id's transfer (from, to, moved) if it is x's.
	logged := func(x *xfer, id uint64) (from, to, moved uint64, ok bool) {
		return bankLogRow(t, ctx, lt, buf, id, incs[x.who].owner, x.seq, x.from, x.to)
	}
	model := bankModel(accts, initial)
	// apply adds x's transfer to the model if one of its runs' log rows is there (at most
	// one: a transfer applied twice is a failure too).
	apply := func(x *xfer, must bool) {
		ids := x.logs
		if x.hasLog && len(ids) == 0 {
			ids = []uint64{x.log}
		}
		found := 0
		for _, id := range ids {
			if from, to, moved, ok := logged(x, id); ok {
				found++
				x.found = true
				model[from] -= moved
				model[to] += moved
			}
		}
		require.LessOrEqual(t, found, 1, "transfer %+v: several log rows", x)
		if must {
			require.Equal(t, 1, found, "acknowledged transfer %+v: its log row is gone", x)
		}
	}
	for _, x := range acked {
		x.state = "acked"
		apply(x, true)
	}
	for _, x := range failed {
		x.state = "failed"
		apply(x, false)
	}
	for _, x := range tries { // in flight when their coordinator died
		x.state = "crashed"
		apply(x, false)
	}
	var total uint64
	bad := 0
	got := map[uint64]uint64{}
	for _, id := range accts {
		got[id] = readU64(t, ctx, rt, id)
		total += got[id]
		if got[id] != model[id] {
			bad++
			t.Errorf("account %d (partition %d): %d, want %d: its opening balance plus the logged transfers", id, layout.Of(id), got[id], model[id])
		}
	}
	if bad > 0 {
		for _, id := range accts {
			if got[id] == model[id] {
				continue
			}
			for _, xs := range [][]*xfer{acked, failed, slices.Collect(maps.Values(tries))} {
				for _, x := range xs {
					if x.from == id || x.to == id {
						t.Logf("account %d: %s %+v (owner %x)", id, x.state, *x, incs[x.who].owner)
					}
				}
			}
		}
	}
	require.Equal(t, uint64(len(accts))*initial, total, "the total is conserved")
}

// mux gathers the lines of cluster-node children started at any time, each with its index.
type mux struct {
	ctx  context.Context
	ch   chan muxEvent
	last []string
}

type muxEvent struct {
	who  int
	line string
	eof  bool
}

func newMux(ctx context.Context) *mux {
	// Large enough that no child waits on the test while it starts another (StartNode).
	return &mux{ctx: ctx, ch: make(chan muxEvent, 1<<16)}
}

func (m *mux) add(who int, p *clustertest.NodeProc) {
	lines := p.Lines()
	go func() {
		for l := range lines {
			select {
			case m.ch <- muxEvent{who: who, line: l}:
			case <-m.ctx.Done():
				return
			}
		}
		select {
		case m.ch <- muxEvent{who: who, eof: true}:
		case <-m.ctx.Done():
		}
	}()
}

// until hands every line to fn, and every child's end to ended, until cond holds (checked
// before each event), within ctx.
func (m *mux) until(t *testing.T, what string, cond func() bool, fn func(who int, line string), ended func(who int)) {
	t.Helper()
	for !cond() {
		select {
		case ev := <-m.ch:
			if ev.eof {
				ended(ev.who)
				continue
			}
			m.last = append(m.last, strconv.Itoa(ev.who)+": "+ev.line)
			if len(m.last) > 30 {
				m.last = m.last[1:]
			}
			fn(ev.who, ev.line)
		case <-m.ctx.Done():
			t.Fatalf("waiting for %s: %v; the latest lines:\n%v", what, m.ctx.Err(), m.last)
		}
	}
}
