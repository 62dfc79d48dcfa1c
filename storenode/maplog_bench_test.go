//go:build unix

package storenode

import (
	"math/rand/v2"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weftdb/weft/base"
)

// BenchmarkCheckpointFewChanges measures a checkpoint that wrote few pages of a large table:
// 3M rows (47k pages) loaded and checkpointed, then per op 100 random single-row updates
// (sync=none) and a Checkpoint. It reports the bytes the checkpoint wrote to the meta file
// and to the map log (maplog-*: appended bytes, or a new log whole) and the checkpoint's
// time and the process's CPU time per op (both include the 100 commits).
func BenchmarkCheckpointFewChanges(b *testing.B) {
	const rows, updates = 3_000_000, 100
	dir := b.TempDir()
	opts := Options{Dir: dir, Sync: SyncNone, CheckpointWALBytes: -1, CheckpointInterval: time.Hour,
		CacheBytes: int64(rows)*64*2 + 64<<20, Logger: quietLogger}
	e, info, g := benchTable(b, opts, (rows+63)/64)
	fences := []base.Fence{{Table: info.ID, Epoch: g.Epoch}}
	seq := prefillTable(b, e, info.ID, fences, uint64(rows+63)/64)
	sizes := func() map[string]int64 {
		ents, err := os.ReadDir(dir)
		if err != nil {
			b.Fatal(err)
		}
		out := make(map[string]int64)
		for _, de := range ents {
			if de.Name() == "meta" || strings.HasPrefix(de.Name(), "maplog-") {
				fi, err := de.Info()
				if err != nil {
					b.Fatal(err)
				}
				out[de.Name()] = fi.Size()
			}
		}
		return out
	}
	rng := rand.New(rand.NewPCG(5, 6))
	row := make([]byte, 64)
	segs := make([]base.Segment, 1)
	prev := sizes()
	var metaBytes, logBytes int64
	var ckpt time.Duration
	cpu := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			b.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	cpu0 := cpu()
	for b.Loop() {
		ch := make(chan error, updates)
		for range updates {
			seq++
			segs[0] = oneRow(info.ID, rng.Uint64N(rows), row)
			e.Commit(&base.Batch{Owner: benchOwner, Seq: seq, Fences: fences, Segments: segs}, func(_ uint64, err error) { ch <- err })
		}
		for range updates {
			if err := <-ch; err != nil {
				b.Fatal(err)
			}
		}
		start := time.Now()
		if err := e.Checkpoint(); err != nil {
			b.Fatal(err)
		}
		ckpt += time.Since(start)
		cur := sizes()
		for name, size := range cur {
			switch {
			case name == "meta":
				metaBytes += size
			case size > prev[name]:
				logBytes += size - prev[name]
			}
		}
		prev = cur
	}
	b.ReportMetric(float64((cpu()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
	b.ReportMetric(float64(metaBytes)/float64(b.N), "meta-B/ckpt")
	b.ReportMetric(float64(logBytes)/float64(b.N), "maplog-B/ckpt")
	b.ReportMetric(float64(ckpt.Microseconds())/float64(b.N), "ckpt-µs")
}
