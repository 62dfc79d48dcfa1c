package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/stretchr/testify/require"
)

func newHists(n int) []*hdrhistogram.Histogram {
	hs := make([]*hdrhistogram.Histogram, n)
	for i := range hs {
		hs[i] = newLatencyHistogram()
	}
	return hs
}

// runAll loads a memBackend and runs every workload on it, as runEngine does.
func runAll(t *testing.T, async int) (*memBackend, *table, map[string]outcome) {
	t.Helper()
	const records, workers = 5000, 8
	ctx := context.Background()
	m := newMemBackend(64)
	loaded := 0
	first, err := m.Load(ctx, LoadSpec{Records: records, RowBytes: 64, Workers: workers, Row: fillRow,
		Progress: func(n int) { loaded += n }})
	require.NoError(t, err)
	require.Equal(t, records, loaded)
	tb := &table{b: m, first: first, n: records, rowBytes: 64}
	hists := newHists(workers)
	outs := map[string]outcome{}
	for _, wl := range Workloads {
		var z *zipf
		if wl == WorkloadMixed {
			z = newZipf(records, zipfTheta)
		}
		out, err := runWorkload(ctx, tb, runSpec{workload: wl, duration: 20 * time.Millisecond, workers: workers, async: async}, hists, z)
		require.NoError(t, err)
		require.Zero(t, out.errs, "%s: %v", wl, out.firstErr)
		require.Positive(t, out.ops, wl)
		require.Equal(t, int64(out.ops), out.hist.TotalCount(), wl)
		outs[wl] = out
	}
	return m, tb, outs
}

// TestWorkloadsKeepLoadedTable runs every workload and checks the model: the loaded rows are
// all still there (delete took only inserted rows), each updated at most as often as updates
// ran, and exactly the inserted rows that delete did not reach remain beside them.
func TestWorkloadsKeepLoadedTable(t *testing.T) {
	for _, async := range []int{0, 4} {
		t.Run(fmt.Sprintf("async=%d", async), func(t *testing.T) {
			m, tb, outs := runAll(t, async)
			var inserted, deleted int
			for w := range tb.inserted {
				inserted += len(tb.inserted[w])
				deleted += tb.deleted[w]
				for i, id := range tb.inserted[w] {
					_, ok := m.rows[id]
					require.Equal(t, i >= tb.deleted[w], ok, "inserted row %d", id)
				}
			}
			require.Equal(t, int(outs[WorkloadInsert].ops), inserted)
			require.Equal(t, int(outs[WorkloadDelete].ops), deleted)
			require.Len(t, m.rows, int(tb.n)+inserted-deleted)
			var bumps uint64
			for id := tb.first; id < tb.first+tb.n; id++ {
				row, ok := m.rows[id]
				require.True(t, ok, "loaded row %d deleted", id)
				require.True(t, rowMatches(row, id))
				bumps += binary.LittleEndian.Uint64(row[8:])
			}
			updates := outs[WorkloadUpdateRandom].ops + outs[WorkloadUpdateSeq].ops + outs[WorkloadMixed].ops
			require.Positive(t, bumps)
			require.LessOrEqual(t, bumps, updates)
		})
	}
}

// TestSeqWorkersWalkOwnRanges checks that sequential workers split the table into contiguous
// ranges and walk them ascending, wrapping.
func TestSeqWorkersWalkOwnRanges(t *testing.T) {
	tb := &table{first: 10, n: 100}
	w := &worker{tb: tb, lo: 10 + 100*1/4, hi: 10 + 100*2/4}
	w.pos = w.lo
	var got []uint64
	for range 27 {
		got = append(got, w.nextID(true))
	}
	require.Equal(t, uint64(35), got[0])
	require.Equal(t, uint64(59), got[24])
	require.Equal(t, uint64(35), got[25], "wraps to the range start")
	for i := 1; i < 25; i++ {
		require.Equal(t, got[i-1]+1, got[i])
	}
	for range 1000 {
		id := w.nextID(false)
		require.True(t, id >= 10 && id < 110, "random id %d outside the table", id)
	}
}

// TestDeleteWithoutInsert checks that delete alone still has rows to delete (the runner
// inserts some untimed) and never touches the loaded rows.
func TestDeleteWithoutInsert(t *testing.T) {
	cfg := &Config{Records: 1000, Workers: 4, Caches: []int64{1 << 20}, Duration: 10 * time.Millisecond, RowBytes: 64,
		Workloads: []string{WorkloadDelete}, Quiet: true}
	r := &runner{cfg: cfg, zipfs: map[uint64]*zipf{}, hists: newHists(4)}
	m := newMemBackend(64)
	f := Factory{Name: "mem", Open: func(context.Context, OpenConfig) (Backend, error) { return m, nil }}
	rs, err := r.runEngine(context.Background(), f, 1<<20)
	require.NoError(t, err)
	require.Len(t, rs, 1)
	require.Positive(t, rs[0].OpsPerSec)
	require.Equal(t, "none", rs[0].Cache)
	require.True(t, m.closed)
	for id := uint64(100); id < 1100; id++ {
		require.Contains(t, m.rows, id)
	}
}
