//go:build unix

package clustertest_test

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/clustertest"
	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/internal/testkit"
	"github.com/weftdb/weft/txnode"
)

// crossNode switches the bank's pairs to accounts on any two storage nodes: on, now that
// node.Update commits across storage nodes (two-phase commit); off, both accounts of a
// transfer are on one storage node (clustertest.BankPairs).
const crossNode = true

// A bank over 3 storage-node processes and 2 cluster-node processes, accounts in every
// partition, each transfer one transaction with its log row, while storage nodes are killed
// with -9 and restarted in turn: the total is conserved, every acknowledged transfer's log
// row is there, and every balance is its opening value plus the transfers whose log rows are
// there (none half applied; a transfer that failed is there whole or not at all). WEFT_SOAK=1
// runs it longer.
func TestBankStorageNodesKilled(t *testing.T) {
	testkit.SkipUnderRace(t, "a kill suite (child processes)")
	kills, perPart, acksPerPhase := 3, 3, 20
	if testing.Short() {
		kills, perPart, acksPerPhase = 2, 2, 10
	}
	if os.Getenv("WEFT_SOAK") == "1" {
		kills, perPart, acksPerPhase = 12, 6, 100
	}
	ctx := testCtx(t, 90*time.Second)
	c := clustertest.Start(t, clustertest.Options{StorageNodes: 3})
	const parts, initial = 12, 1000 // p on storage node p%3: each cluster node owns two partitions on every one
	accts := createRows(t, c, "acct", parts, perPart, initial)
	createRows(t, c, "xlog", parts, 0, 0)
	procs := []*clustertest.NodeProc{
		c.StartNode(clustertest.NodeSpec{Owner: 0xa, Addr: "game-a:7000", Workload: clustertest.WorkloadBank,
			Table: "acct", LogTable: "xlog", Parts: parity(parts, 0), Rows: accts, CrossNode: crossNode, Seed: 1, Reown: true}),
		c.StartNode(clustertest.NodeSpec{Owner: 0xb, Addr: "game-b:7000", Workload: clustertest.WorkloadBank,
			Table: "acct", LogTable: "xlog", Parts: parity(parts, 1), Rows: accts, CrossNode: crossNode, Seed: 2, Reown: true}),
	}
	layout := cluster.Layout{Partitions: parts, StripePages: 1}
	nodeOf := func(id uint64) string { return c.Addrs()[layout.Of(id)%3] }

	type xfer struct {
		who      int
		seq, log uint64
		hasLog   bool
		from, to uint64
	}
	tries := []map[uint64]xfer{{}, {}}
	var acked, failed []xfer
	acks := 0
	acksOn := map[string]int{}  // acknowledged transfers by storage node
	triesOn := map[string]int{} // attempted transfers by storage node
	classes := map[string]int{}
	record := func(who int, line string) {
		f := clustertest.Fields(line)
		num := fieldNum(t, line, f)
		switch f[0] {
		case "try":
			tries[who][num(1)] = xfer{who: who, seq: num(1), from: num(2), to: num(3)}
			triesOn[nodeOf(num(2))]++
		case "ok", "err":
			x, ok := tries[who][num(1)]
			require.True(t, ok, "an answer with no try: %s", line)
			delete(tries[who], num(1))
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
			}
		}
	}
	ev := newEvents(t, ctx, procs...)
	progress := func(what string, count func() int, n int) {
		t.Helper()
		want := count() + n
		ev.until(what, func() bool { return count() >= want }, record)
	}
	progress("transfers", func() int { return acks }, acksPerPhase)
	for k := range kills {
		s := c.Storage[k%len(c.Storage)]
		s.Kill()
		// Until both nodes have tried transfers on it while it is down (each such call waits
		// for the storage node within its context): the restart comes while they wait.
		progress("transfers tried on the killed storage node", func() int { return triesOn[s.Addr] }, 2)
		s.Restart()
		progress("transfers on the restarted storage node", func() int { return acksOn[s.Addr] }, acksPerPhase/2)
	}
	for _, p := range procs {
		require.NoError(t, p.CloseInput())
	}
	ev.until("the nodes' ends", func() bool { return ev.alive == 0 }, record)
	for _, p := range procs {
		require.NoError(t, p.Wait(ctx))
	}
	t.Logf("%d transfers acknowledged, %d failed (%v), %d storage-node kills", len(acked), len(failed), classes, kills)

	// Read through a node opened now (it owns nothing: the storage nodes' durable rows).
	r, lt := openBankReader(t, ctx, c)
	owners := []uint64{0xa, 0xb}
	buf := make([]byte, lt.RowBytes())
	// logged returns the transfer's log row (from, to, moved), if it is there.
	logged := func(x xfer) (from, to, moved uint64, ok bool) {
		if !x.hasLog {
			return 0, 0, 0, false
		}
		return bankLogRow(t, ctx, lt, buf, x.log, owners[x.who], x.seq, x.from, x.to)
	}
	model := bankModel(accts, initial)
	apply := func(x xfer, must bool) {
		from, to, moved, ok := logged(x)
		if must {
			require.True(t, ok, "acknowledged transfer %+v: its log row is gone", x)
		}
		if ok {
			model[from] -= moved
			model[to] += moved
		}
	}
	for _, x := range acked {
		apply(x, true)
	}
	for _, x := range failed {
		apply(x, false)
	}
	var total uint64
	for _, id := range accts {
		got := readU64(t, ctx, r, id)
		total += got
		require.Equal(t, model[id], got, "account %d: its opening balance plus the logged transfers", id)
	}
	require.Equal(t, uint64(len(accts))*initial, total, "the total is conserved")
}

// openBankReader opens the bank's tables through a node opened now (owner 0xc, owning
// nothing: it reads the storage nodes' durable rows).
func openBankReader(t *testing.T, ctx context.Context, c *clustertest.Cluster) (acct, xlog *node.Table) {
	t.Helper()
	reader := c.OpenNode(0xc, "")
	acct, err := reader.OpenTable(ctx, "acct")
	require.NoError(t, err)
	xlog, err = reader.OpenTable(ctx, "xlog")
	require.NoError(t, err)
	return acct, xlog
}

// bankLogRow reads log row id of lt into buf and returns its transfer (from, to, moved) if it
// is transfer seq of owner (its from and to must then be wantFrom and wantTo); ok is false if
// the row is not there or the id went to another row.
func bankLogRow(t *testing.T, ctx context.Context, lt *node.Table, buf []byte, id, owner, seq, wantFrom, wantTo uint64) (from, to, moved uint64, ok bool) {
	t.Helper()
	err := lt.Get(ctx, id, buf)
	if errors.Is(err, txnode.ErrNotFound) {
		return 0, 0, 0, false
	}
	require.NoError(t, err)
	w := func(i int) uint64 { return binary.LittleEndian.Uint64(buf[8*i:]) }
	if w(3) != owner || w(4) != seq {
		return 0, 0, 0, false // the id went to another row
	}
	require.Equal(t, wantFrom, w(0))
	require.Equal(t, wantTo, w(1))
	return w(0), w(1), w(2), true
}

// bankModel is the bank's balances at the opening: initial in every account.
func bankModel(accts []uint64, initial uint64) map[uint64]uint64 {
	model := map[uint64]uint64{}
	for _, id := range accts {
		model[id] = initial
	}
	return model
}

// fieldNum returns field i of line (f is clustertest.Fields of it) as a number; the test
// fails if it is not one.
func fieldNum(t *testing.T, line string, f []string) func(i int) uint64 {
	return func(i int) uint64 {
		v, err := strconv.ParseUint(f[i], 10, 64)
		require.NoError(t, err, line)
		return v
	}
}
