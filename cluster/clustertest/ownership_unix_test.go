//go:build unix

package clustertest_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster/clustertest"
	"github.com/weftdb/weft/internal/testkit"
	"github.com/weftdb/weft/sgio"
)

// A cluster node (a process) owning a partition on each of 3 storage nodes (processes),
// incrementing their counters, is frozen (SIGSTOP) past its lease; another node takes its
// partitions (OwnWait) and increments them; resumed (SIGCONT), every write the frozen node
// attempts fails, on every storage node, and none is visible; the new owner's writes all
// survive, and nothing the frozen node acknowledged before is lost. Each storage node
// refuses the frozen node's grant (its epoch) itself.
//
// Two ways. local: the resumed node's own clock tells it its lease ran out, or etcd that it
// was lost, so its writes fail before they leave it (and a probe shows each storage node
// refuses its grant). blind: its lease clock did not see the freeze (NodeSpec.BlindClock)
// and it cannot reach etcd (its own link, cut while it is frozen), so it believes it still
// owns the partitions and sends its batches: each storage node must refuse them itself, on
// the real write path (the class "fenced": storenode.ErrFenced over the wire).
func TestFrozenOwnerFencedOnEveryStorageNode(t *testing.T) {
	testkit.SkipUnderRace(t, "a freeze suite (child processes)")
	t.Run("local", func(t *testing.T) { testFrozenOwner(t, false) })
	t.Run("blind", func(t *testing.T) { testFrozenOwner(t, true) })
}

func testFrozenOwner(t *testing.T, blind bool) {
	ctx := testCtx(t, 120*time.Second)
	opts := clustertest.Options{StorageNodes: 3}
	if blind {
		// The storage nodes' lease long (the transaction node re-registers its grants every
		// quarter of it, 150 s, longer than the test may run): no re-registration, which the
		// storage node would refuse (latching the fencing in the node before any batch left
		// it), races the resumed node's batches.
		opts.LeaseDuration = 10 * time.Minute
	}
	c := clustertest.Start(t, opts)
	const parts = 3 // partition p on storage node p
	ids := createRows(t, c, "ctr", parts, 1, 0)
	all := []uint32{0, 1, 2}
	const frozenOwner, takerOwner = 0xa, 0xb
	spec := clustertest.NodeSpec{Owner: frozenOwner, Addr: "game-a:7000", Workload: clustertest.WorkloadCounter,
		Table: "ctr", Parts: all, Rows: ids}
	if blind {
		// The lease long enough that, resumed, the node's blind clock leaves it seconds to
		// try every partition before it would lapse on its own.
		spec.BlindClock, spec.OwnEtcdLink, spec.TTL = true, true, 10*time.Second
		// With its etcd link cut, a refused write's holder lookup fails: at once, not after
		// seconds of the window the blind clock leaves it.
		spec.OwnerLookupTimeout = 50 * time.Millisecond
	}
	a := c.StartNode(spec)
	epochs := make([]uint64, parts)
	for p := range uint32(parts) {
		h, ok, err := c.Client.Owner(ctx, "ctr", p)
		require.NoError(t, err)
		require.True(t, ok)
		require.EqualValues(t, frozenOwner, h.Owner)
		epochs[p] = h.Epoch
	}

	tally := clustertest.NewCounterTally()
	last := make([]uint64, parts) // a's last acknowledged value per partition
	inflight := -1                // a's partition with a try and no answer yet
	read := func(l string) clustertest.CounterLine {
		t.Helper()
		cl, err := tally.Add(l)
		require.NoError(t, err)
		switch cl.Kind {
		case "try":
			inflight = int(cl.Part)
		case "ok":
			last[cl.Part] = cl.Value
			inflight = -1
		case "err":
			t.Fatalf("the owner failed before the freeze: %s", l)
		}
		return cl
	}
	writes := 10
	if testing.Short() {
		writes = 4
	}
	for slices.Min(last) < uint64(writes) {
		read(a.Line(ctx))
	}
	// What it printed before it stopped: all of it (a line still in the pipe at the freeze
	// would otherwise be taken, after the resume, for a write made after the takeover).
	before, err := a.Freeze(ctx)
	if errors.Is(err, errors.ErrUnsupported) {
		a.Cont()
		t.Skip(err)
	}
	require.NoError(t, err)
	for _, l := range before {
		read(l)
	}
	if blind {
		a.EtcdLink.Cut(true)
	}

	b := c.OpenNode(takerOwner, "game-b:7000")
	tb, err := b.OpenTable(ctx, "ctr")
	require.NoError(t, err)
	require.NoError(t, tb.OwnWait(ctx, all...), "b takes the frozen node's partitions once its lease expired")
	base := make([]uint64, parts)
	for i, id := range ids {
		p := tb.Partition(id)
		require.EqualValues(t, i, p)
		base[p] = readU64(t, ctx, tb, id)
		maxv := last[p]
		if inflight == int(p) {
			maxv++
		}
		require.GreaterOrEqual(t, base[p], last[p], "partition %d: an acknowledged increment of the frozen node lost", p)
		require.LessOrEqual(t, base[p], maxv, "partition %d: more than the frozen node attempted", p)
		h, _, err := c.Client.Owner(ctx, "ctr", p)
		require.NoError(t, err)
		require.Greater(t, h.Epoch, epochs[p])
	}
	incs := 5
	for range incs {
		for _, id := range ids {
			require.NoError(t, tb.Update(ctx, id, func(r []byte) error {
				copy(r, u64Row(readU64Bytes(r)+1))
				return nil
			}))
		}
	}

	a.Cont()
	// The write in flight at the freeze (if any) may end either way: it reached its storage
	// node before the takeover, or is refused. Every write a begins after it is one it
	// attempts after the takeover: each must fail with a fencing error. Until it has tried
	// every partition, one per storage node, twice.
	after := map[uint32]int{}
	fenced := map[uint32]bool{} // blind: the partitions whose storage node refused a batch of a's
	for len(after) < parts || slices.Min(mapValues(after)) < 2 || blind && len(fenced) < parts {
		l := a.Line(ctx)
		t.Logf("resumed: %s", l)
		cl, err := tally.Add(l)
		require.NoError(t, err)
		switch {
		case cl.Kind == "try":
			inflight = -1
		case (cl.Kind == "ok" || cl.Kind == "err") && inflight >= 0:
			require.EqualValues(t, inflight, cl.Part)
			t.Logf("the write in flight at the freeze: %s", l)
			if cl.Kind == "ok" {
				require.LessOrEqual(t, cl.Value, base[cl.Part], "the write in flight at the freeze was acknowledged, but applied after the new owner read the counter")
			}
			if cl.Class == "fenced" {
				fenced[cl.Part] = true // its storage node refused it (the fencing latched: the next write fails locally)
			}
			inflight = -1
		case cl.Kind == "ok":
			t.Fatalf("the resumed node wrote after the takeover: %s", l)
		case cl.Kind == "err":
			require.Contains(t, clustertest.FencedClasses, cl.Class, "the resumed node's write failed, but not for want of its grant: %s", l)
			if blind && !fenced[cl.Part] {
				// Its first write of the partition reached the storage node (nothing local
				// stopped it): refused there. Later ones may fail locally (txnode latches
				// the fencing).
				require.Equal(t, "fenced", cl.Class, "the blind node's first write of partition %d after the takeover was not refused by its storage node: %s", cl.Part, l)
				fenced[cl.Part] = true
			}
			after[cl.Part]++
		}
	}
	if blind {
		a.EtcdLink.Cut(false) // so that it closes its node promptly
	}
	t.Logf("the resumed node's failures: %v", tally.Errs)
	require.NoError(t, a.CloseInput())
	require.NoError(t, a.Wait(ctx))

	// Every storage node refuses the frozen node's grant itself.
	for p := range uint32(parts) {
		err := c.FenceProbe(ctx, tb.NodeOf(ids[p]), "ctr", p, frozenOwner, epochs[p])
		require.ErrorIs(t, err, sgio.ErrFenced, "storage node %s took the frozen node's old grant of partition %d", tb.NodeOf(ids[p]), p)
	}
	// The final values from the storage nodes' durable rows, through a node that owns nothing.
	r, err := c.OpenNode(0xc, "").OpenTable(ctx, "ctr")
	require.NoError(t, err)
	for p, id := range ids {
		got := readU64(t, ctx, r, id)
		require.Equal(t, base[p]+uint64(incs), got, "partition %d: the new owner's writes, and nothing of the resumed node's", p)
	}
	require.Equal(t, fmt.Sprint(c.Addrs()), fmt.Sprint([]string{tb.NodeOf(ids[0]), tb.NodeOf(ids[1]), tb.NodeOf(ids[2])}),
		"one partition on each storage node")
}

func readU64Bytes(b []byte) uint64 {
	var v uint64
	for i := 7; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v
}

func mapValues(m map[uint32]int) []int {
	var out []int
	for _, v := range m {
		out = append(out, v)
	}
	return out
}
