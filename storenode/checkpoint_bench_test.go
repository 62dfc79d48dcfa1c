package storenode

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/logicpage"
)

// BenchmarkCommitLatencyInCheckpoint measures what a checkpoint of a large dirty cache costs
// the commits that run beside it: each op dirties every page of a table of rows 64-byte rows
// (whole-page commits), then runs one Checkpoint while 16 committers commit single random
// rows, and records every commit's latency (Commit to its acknowledgement) that started while
// the checkpoint ran. It reports their p50, p99, p999 and max in microseconds, and the
// commits that ran during the checkpoints (commits/ckpt). sync=none: the acknowledgement is
// the WAL write, so the figures are the engine's own waits (its lock, the WAL's writer).
func BenchmarkCommitLatencyInCheckpoint(b *testing.B) {
	for _, rows := range []int{1 << 21} {
		b.Run(fmt.Sprintf("rows=%d", rows), func(b *testing.B) { benchCommitLatencyInCheckpoint(b, rows) })
	}
}

func benchCommitLatencyInCheckpoint(b *testing.B, rows int) {
	pages := uint64(rows / logicpage.RowsPerPage)
	opts := Options{Dir: b.TempDir(), Sync: SyncNone, CheckpointWALBytes: -1, CheckpointInterval: time.Hour,
		CacheBytes: int64(rows)*64*2 + 64<<20, Logger: quietLogger}
	e, info, g := benchTable(b, opts, int(pages))
	fences := []base.Fence{{Table: info.ID, Epoch: g.Epoch}}
	var (
		mu        sync.Mutex
		seq       uint64
		inCkpt    bool
		latencies []time.Duration
		commits   int
	)
	commit := func(segs []base.Segment) <-chan error {
		ch := make(chan error, 1)
		mu.Lock()
		seq++
		e.Commit(&base.Batch{Owner: benchOwner, Seq: seq, Fences: fences, Segments: segs}, func(_ uint64, err error) { ch <- err })
		mu.Unlock()
		return ch
	}
	full := make([]byte, 16*logicpage.RowsPerPage*64)
	for b.Loop() {
		// Dirty every page: 16 whole pages a commit.
		var pending []<-chan error
		for p := uint64(0); p < pages; p += 16 {
			segs := make([]base.Segment, 0, 16)
			for q := p; q < min(p+16, pages); q++ {
				off := (q - p) * logicpage.RowsPerPage * 64
				segs = append(segs, base.Segment{Table: info.ID, Page: q, Data: ^uint64(0), Rows: full[off : off+logicpage.RowsPerPage*64]})
			}
			pending = append(pending, commit(segs))
			if len(pending) == 64 {
				for _, ch := range pending {
					if err := <-ch; err != nil {
						b.Fatal(err)
					}
				}
				pending = pending[:0]
			}
		}
		for _, ch := range pending {
			if err := <-ch; err != nil {
				b.Fatal(err)
			}
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		mu.Lock()
		inCkpt = true
		mu.Unlock()
		for w := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(w), 9))
				row := make([]byte, 64)
				for {
					select {
					case <-stop:
						return
					default:
					}
					start := time.Now()
					if err := <-commit([]base.Segment{oneRow(info.ID, rng.Uint64N(uint64(rows)), row)}); err != nil {
						b.Error(err)
						return
					}
					d := time.Since(start)
					mu.Lock()
					if inCkpt {
						latencies = append(latencies, d)
						commits++
					}
					mu.Unlock()
				}
			}()
		}
		if err := e.Checkpoint(); err != nil {
			b.Fatal(err)
		}
		mu.Lock()
		inCkpt = false
		mu.Unlock()
		close(stop)
		wg.Wait()
	}
	slices.Sort(latencies)
	q := func(f float64) float64 {
		if len(latencies) == 0 {
			return 0
		}
		return float64(latencies[min(len(latencies)-1, int(f*float64(len(latencies))))].Microseconds())
	}
	b.ReportMetric(q(0.5), "p50-us")
	b.ReportMetric(q(0.99), "p99-us")
	b.ReportMetric(q(0.999), "p999-us")
	b.ReportMetric(q(1), "max-us")
	b.ReportMetric(float64(commits)/float64(b.N), "commits/ckpt")
}

// BenchmarkUpdateRandomScale measures random single-row updates (sync=none, 128 batches in
// flight, background checkpoints on) over a small and a 10x larger table, written whole and
// checkpointed first, whose pages all fit
// the cache, with CheckpointWALBytes scaled down as the tables are (16 MiB against 3M rows is
// the default 256 MiB against 48M rows): the question is whether checkpoints make the larger
// table slower per update. It reports updates/s, the pages checkpoints wrote per 1,000
// updates, and the checkpoints per op-second.
func BenchmarkUpdateRandomScale(b *testing.B) {
	for _, rows := range []int{300_000, 3_000_000} {
		b.Run(fmt.Sprintf("rows=%d", rows), func(b *testing.B) {
			opts := Options{Dir: b.TempDir(), Sync: SyncNone, CheckpointWALBytes: 16 << 20, CheckpointInterval: time.Hour,
				CacheBytes: int64(rows)*64*2 + 64<<20, Logger: quietLogger}
			e, info, g := benchTable(b, opts, (rows+63)/64)
			fences := []base.Fence{{Table: info.ID, Epoch: g.Epoch}}
			seq := prefillTable(b, e, info.ID, fences, uint64(rows+63)/64)
			slots := make(chan struct{}, 128)
			var pending sync.WaitGroup
			var errMu sync.Mutex
			var firstErr error
			done := func(_ uint64, err error) {
				if err != nil {
					errMu.Lock()
					firstErr = err
					errMu.Unlock()
				}
				<-slots
				pending.Done()
			}
			rng := rand.New(rand.NewPCG(3, uint64(rows)))
			row := make([]byte, 64)
			segs := make([]base.Segment, 1)
			before := e.Stats()
			start := time.Now()
			for b.Loop() {
				slots <- struct{}{}
				pending.Add(1)
				seq++
				segs[0] = oneRow(info.ID, rng.Uint64N(uint64(rows)), row)
				e.Commit(&base.Batch{Owner: benchOwner, Seq: seq, Fences: fences, Segments: segs}, done)
			}
			pending.Wait()
			elapsed := time.Since(start).Seconds()
			if firstErr != nil {
				b.Fatal(firstErr)
			}
			after := e.Stats()
			b.ReportMetric(float64(b.N)/elapsed, "updates/s")
			b.ReportMetric(float64(after.CheckpointPages-before.CheckpointPages)*1000/float64(b.N), "ckpt-pages/1k-updates")
			b.ReportMetric(float64(after.Checkpoints-before.Checkpoints), "checkpoints")
		})
	}
}

// prefillTable commits every row of pages whole pages (16 a batch, 64 batches in flight) and
// checkpoints; it returns the last seq used by benchOwner.
func prefillTable(b *testing.B, e *Engine, table uint32, fences []base.Fence, pages uint64) uint64 {
	full := make([]byte, 16*logicpage.RowsPerPage*64)
	var seq uint64
	var pending []chan error
	flush := func() {
		for _, ch := range pending {
			if err := <-ch; err != nil {
				b.Fatal(err)
			}
		}
		pending = pending[:0]
	}
	for p := uint64(0); p < pages; p += 16 {
		segs := make([]base.Segment, 0, 16)
		for q := p; q < min(p+16, pages); q++ {
			off := (q - p) * logicpage.RowsPerPage * 64
			segs = append(segs, base.Segment{Table: table, Page: q, Data: ^uint64(0), Rows: full[off : off+logicpage.RowsPerPage*64]})
		}
		ch := make(chan error, 1)
		seq++
		e.Commit(&base.Batch{Owner: benchOwner, Seq: seq, Fences: fences, Segments: segs}, func(_ uint64, err error) { ch <- err })
		if pending = append(pending, ch); len(pending) == 64 {
			flush()
		}
	}
	flush()
	if err := e.Checkpoint(); err != nil {
		b.Fatal(err)
	}
	return seq
}
