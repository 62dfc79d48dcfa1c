package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/weftdb/weft/internal/latency"
)

// Workload names, in the order a run performs them. Insert comes first so that delete, which
// deletes only the rows insert added, leaves the loaded table whole for every other workload.
const (
	WorkloadInsert       = "insert"
	WorkloadUpdateRandom = "update-random"
	WorkloadUpdateSeq    = "update-seq"
	WorkloadQueryRandom  = "query-random"
	WorkloadQuerySeq     = "query-seq"
	WorkloadDelete       = "delete"
	WorkloadMixed        = "mixed"
)

// Workloads lists every workload in run order.
var Workloads = []string{WorkloadInsert, WorkloadUpdateRandom, WorkloadUpdateSeq,
	WorkloadQueryRandom, WorkloadQuerySeq, WorkloadDelete, WorkloadMixed}

// mixedUpdatePercent is the share of updates in the mixed workload (the rest are gets).
const mixedUpdatePercent = 20

// ParseWorkloads parses a comma-separated subset of Workloads ("all" for every one) and
// returns it in run order.
func ParseWorkloads(s string) ([]string, error) {
	if s == "" || s == "all" {
		return slices.Clone(Workloads), nil
	}
	want := map[string]bool{}
	for _, w := range strings.Split(s, ",") {
		w = strings.TrimSpace(w)
		if !slices.Contains(Workloads, w) {
			return nil, fmt.Errorf("bench: unknown workload %q (want some of %s)", w, strings.Join(Workloads, ","))
		}
		want[w] = true
	}
	var out []string
	for _, w := range Workloads {
		if want[w] {
			out = append(out, w)
		}
	}
	return out, nil
}

// table is one loaded table of one backend: the ids first..first+n-1 hold loaded rows, which
// no workload deletes; inserted[w] are the ids worker w's inserts added, deleted[w] how many
// of them the delete workload has deleted.
type table struct {
	b        Backend
	first, n uint64
	rowBytes int
	inserted [][]uint64
	deleted  []int
}

// runSpec is one workload run.
type runSpec struct {
	workload string
	duration time.Duration
	workers  int
	async    int // transactions in flight per worker; 0: one synchronous op at a time
}

// outcome is what a workload run measured.
type outcome struct {
	ops, reads uint64
	elapsed    time.Duration
	hist       *hdrhistogram.Histogram
	series     []latency.Snapshot // the ops ended in each seriesInterval, all workers merged
	interval   time.Duration
	before     Stats
	after      Stats
	cpu        time.Duration // this process's CPU time during the run
	errs       uint64
	firstErr   error
}

// errWrongRow reports a read that returned another row's bytes.
var errWrongRow = errors.New("bench: read returned the wrong row")

// worker is one goroutine of a workload. Its state is its own: no sharing on the hot path
// but the stop flag.
type worker struct {
	idx      int
	tb       *table
	r        rng
	h        *hdrhistogram.Histogram
	series   series // the worker's ops by when they ended (report.go)
	row      []byte
	lo, hi   uint64 // the worker's own id range, for sequential workloads
	pos      uint64
	ops      uint64
	reads    uint64
	errs     uint64
	firstErr error
	zipf     *zipf
	sess     AsyncSession
	_        [64]byte // the next worker's hot fields are on another cache line
}

// runWorkload runs one workload on tb with fresh workers and returns what it measured.
func runWorkload(ctx context.Context, tb *table, spec runSpec, hists []*hdrhistogram.Histogram, z *zipf) (outcome, error) {
	var async AsyncBackend
	if spec.async > 0 {
		ab, ok := tb.b.(AsyncBackend)
		if !ok {
			return outcome{}, fmt.Errorf("bench: --async: the backend has no asynchronous sessions")
		}
		async = ab
	}
	if tb.inserted == nil {
		tb.inserted = make([][]uint64, spec.workers)
		tb.deleted = make([]int, spec.workers)
	}
	ws := make([]*worker, spec.workers)
	seed := uint64(time.Now().UnixNano())
	for i := range ws {
		h := hists[i]
		h.Reset()
		w := &worker{idx: i, tb: tb, r: newRNG(seed + uint64(i)), h: h, row: make([]byte, tb.rowBytes), zipf: z,
			series: newSeries(spec.duration)}
		w.lo = tb.first + tb.n*uint64(i)/uint64(spec.workers)
		w.hi = tb.first + tb.n*uint64(i+1)/uint64(spec.workers)
		w.pos = w.lo
		if async != nil {
			w.sess = async.NewSession()
		}
		ws[i] = w
	}
	var stop atomic.Bool
	start := make(chan struct{})
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if spec.async > 0 {
				w.runAsync(ctx, spec.workload, spec.async, &stop)
			} else {
				w.runSync(ctx, spec.workload, &stop)
			}
		}()
	}
	out := outcome{before: tb.b.Stats()}
	cpu0 := processCPU()
	t0 := time.Now()
	close(start)
	timer := time.AfterFunc(spec.duration, func() { stop.Store(true) })
	stopOnCancel := context.AfterFunc(ctx, func() { stop.Store(true) })
	wg.Wait()
	out.elapsed = time.Since(t0)
	out.cpu = processCPU() - cpu0
	timer.Stop()
	stopOnCancel()
	out.after = tb.b.Stats()
	out.hist = hists[0]
	out.series, out.interval = mergeSeries(ws), ws[0].series.interval
	for i, w := range ws {
		if i > 0 {
			out.hist.Merge(w.h)
		}
		out.ops += w.ops
		out.reads += w.reads
		out.errs += w.errs
		if out.firstErr == nil {
			out.firstErr = w.firstErr
		}
	}
	return out, ctx.Err()
}

// nextID picks the row of the next op of a read or update workload.
func (w *worker) nextID(seq bool) uint64 {
	if seq {
		id := w.pos
		if w.pos++; w.pos >= w.hi {
			w.pos = w.lo
		}
		return id
	}
	return w.tb.first + w.r.below(w.tb.n)
}

func (w *worker) fail(err error) {
	w.errs++
	if w.firstErr == nil {
		w.firstErr = err
	}
}

// nextDelete returns the next id this worker inserted and has not deleted.
func (w *worker) nextDelete() (uint64, bool) {
	i := w.tb.deleted[w.idx]
	if i >= len(w.tb.inserted[w.idx]) {
		return 0, false
	}
	w.tb.deleted[w.idx] = i + 1
	return w.tb.inserted[w.idx][i], true
}

// runSync runs one op at a time until stop.
func (w *worker) runSync(ctx context.Context, workload string, stop *atomic.Bool) {
	b := w.tb.b
	seq := workload == WorkloadUpdateSeq || workload == WorkloadQuerySeq
	base := time.Now() // latencies read only the monotonic clock: time.Since(base)
	for !stop.Load() {
		var err error
		var id uint64
		t0 := time.Since(base)
		switch workload {
		case WorkloadInsert:
			fillRow(w.row, 0)
			id, err = b.Insert(ctx, w.row)
			if err == nil {
				w.tb.inserted[w.idx] = append(w.tb.inserted[w.idx], id)
			}
		case WorkloadUpdateRandom, WorkloadUpdateSeq:
			err = b.Update(ctx, w.nextID(seq), updateRow)
			w.reads++
		case WorkloadQueryRandom, WorkloadQuerySeq:
			id = w.nextID(seq)
			if err = b.Get(ctx, id, w.row); err == nil && !rowMatches(w.row, id) {
				err = fmt.Errorf("%w: asked for %d, got %d", errWrongRow, id, rowID(w.row))
			}
			w.reads++
		case WorkloadDelete:
			var ok bool
			if id, ok = w.nextDelete(); !ok {
				return // every row this worker inserted is gone
			}
			err = b.Delete(ctx, id)
			w.reads++
		case WorkloadMixed:
			id = w.tb.first + w.zipf.scrambled(&w.r)
			if w.r.below(100) < mixedUpdatePercent {
				err = b.Update(ctx, id, updateRow)
			} else if err = b.Get(ctx, id, w.row); err == nil && !rowMatches(w.row, id) {
				err = fmt.Errorf("%w: asked for %d, got %d", errWrongRow, id, rowID(w.row))
			}
			w.reads++
		}
		d := time.Since(base) - t0
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.fail(err)
			continue
		}
		recordLatency(w.h, d)
		w.series.record(t0+d, d)
		w.ops++
	}
}

// inflightOp is an op started by an asynchronous session and not yet waited for.
type inflightOp struct {
	p       Pending
	t0      time.Duration // since the worker's base time
	id      uint64        // the inserted id, for insert
	insert  bool
	checkID uint64 // a get to check: the id asked for (checked at start, result kept here)
	err     error  // a failed check
}

// runAsync keeps up to depth ops in flight: it starts ops until depth are pending, then waits
// for the oldest. A latency is the time from start to durable.
func (w *worker) runAsync(ctx context.Context, workload string, depth int, stop *atomic.Bool) {
	ring := make([]inflightOp, depth)
	head, n := 0, 0
	base := time.Now()
	finish := func(op *inflightOp) {
		err := op.p.Wait(ctx)
		d := time.Since(base) - op.t0
		if err == nil {
			err = op.err
		}
		switch {
		case err != nil:
			if ctx.Err() == nil {
				w.fail(err)
			}
		default:
			if op.insert {
				w.tb.inserted[w.idx] = append(w.tb.inserted[w.idx], op.id)
			}
			recordLatency(w.h, d)
			w.series.record(op.t0+d, d)
			w.ops++
		}
		*op = inflightOp{}
	}
	seq := workload == WorkloadUpdateSeq || workload == WorkloadQuerySeq
	s := w.sess
	exhausted := false // delete: every row this worker inserted is gone
	for !exhausted && !stop.Load() && ctx.Err() == nil {
		if n == depth {
			finish(&ring[head])
			head = (head + 1) % depth
			n--
		}
		op := &ring[(head+n)%depth]
		op.t0 = time.Since(base)
		switch workload {
		case WorkloadInsert:
			fillRow(w.row, 0)
			op.id, op.p = s.Insert(ctx, w.row)
			op.insert = true
		case WorkloadUpdateRandom, WorkloadUpdateSeq:
			op.p = s.Update(ctx, w.nextID(seq), updateRow)
			w.reads++
		case WorkloadQueryRandom, WorkloadQuerySeq:
			id := w.nextID(seq)
			op.p = s.Get(ctx, id, w.row)
			op.err = w.checkGet(id)
			w.reads++
		case WorkloadDelete:
			id, ok := w.nextDelete()
			if !ok {
				exhausted = true
				continue
			}
			op.p = s.Delete(ctx, id)
			w.reads++
		case WorkloadMixed:
			id := w.tb.first + w.zipf.scrambled(&w.r)
			if w.r.below(100) < mixedUpdatePercent {
				op.p = s.Update(ctx, id, updateRow)
			} else {
				op.p = s.Get(ctx, id, w.row)
				op.err = w.checkGet(id)
			}
			w.reads++
		}
		n++
	}
	for ; n > 0; n-- {
		finish(&ring[head])
		head = (head + 1) % depth
	}
}

// checkGet checks the row an asynchronous get just copied (zeroed first, so a failed get is
// not mistaken for a wrong row: its error arrives with Wait).
func (w *worker) checkGet(id uint64) error {
	defer clear(w.row)
	if rowID(w.row) == 0 || rowMatches(w.row, id) {
		return nil
	}
	return fmt.Errorf("%w: asked for %d, got %d", errWrongRow, id, rowID(w.row))
}
