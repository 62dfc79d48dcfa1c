package wal

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weftdb/weft/internal/vfs"
)

// The benchmarks run on the operating system's file system (vfs.Default) in b.TempDir(), so
// they measure the disk of the machine: fdatasync dominates SyncAlways. Beside them,
// BenchmarkRawFdatasync is the disk's own limit: one write and one fdatasync per record.
//
// They use b.N rather than b.Loop: the appends come from many goroutines, which share one
// iteration counter, and b.Loop may only be called by the benchmark's own goroutine.

var (
	benchAppenders = []int{1, 16, 128}
	benchPayloads  = []int{64, 4096}
)

func BenchmarkAppend(b *testing.B) {
	for _, mode := range []SyncMode{SyncAlways, SyncNone} {
		for _, appenders := range benchAppenders {
			for _, payload := range benchPayloads {
				name := fmt.Sprintf("sync=%s/appenders=%d/payload=%d", mode, appenders, payload)
				b.Run(name, func(b *testing.B) {
					benchAppend(b, Options{Sync: mode}, appenders, payload)
				})
			}
		}
	}
}

// BenchmarkAppendVariants compares the writer's yield before cutting a group, and segment
// preallocation, with their absence. Preallocation matters most when every write extends the
// file by new blocks, so it is also measured with 4 KiB payloads.
func BenchmarkAppendVariants(b *testing.B) {
	variants := []struct {
		name     string
		opts     Options
		payloads []int
	}{
		{"default", Options{}, benchPayloads},
		{"noyield", Options{noYield: true}, benchPayloads[:1]},
		{"gather", Options{Gather: true}, benchPayloads[:1]},
		{"noprealloc", Options{noPreallocate: true}, benchPayloads},
	}
	for _, mode := range []SyncMode{SyncAlways, SyncNone} {
		for _, appenders := range []int{1, 16, 128} {
			for _, v := range variants {
				for _, payload := range v.payloads {
					opts := v.opts
					opts.Sync = mode
					name := fmt.Sprintf("sync=%s/appenders=%d/payload=%d/variant=%s", mode, appenders, payload, v.name)
					b.Run(name, func(b *testing.B) { benchAppend(b, opts, appenders, payload) })
				}
			}
		}
	}
}

func benchAppend(b *testing.B, opts Options, appenders, payloadBytes int) {
	dir := b.TempDir()
	// The disk's fdatasync rate varies several-fold from minute to minute on a shared
	// virtual disk, so each SyncAlways run measures it right before, in the same directory.
	var diskSyncsPerSec float64
	if opts.Sync == SyncAlways {
		diskSyncsPerSec = measureDiskSyncs(b, dir, recordSize(payloadBytes))
	}
	w, err := Open(vfs.Default, dir, opts, nil)
	if err != nil {
		b.Fatal(err)
	}
	payload := [][]byte{make([]byte, payloadBytes)}
	b.SetBytes(int64(payloadBytes))
	b.ReportAllocs()
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	b.ResetTimer()
	for range appenders {
		wg.Go(func() {
			ctx := context.Background()
			for next.Add(1) <= int64(b.N) {
				if _, err := w.Append(ctx, 1, payload, false); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	elapsed := time.Since(start)
	st := w.Stats()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "appends/s")
	b.ReportMetric(float64(st.Records)/float64(max(st.Groups, 1)), "records/write")
	if opts.Sync == SyncAlways {
		b.ReportMetric(st.RecordsPerSync, "records/sync")
		b.ReportMetric(float64(st.Syncs)/elapsed.Seconds(), "syncs/s")
		b.ReportMetric(diskSyncsPerSec, "disk-syncs/s")
	}
	if err := w.Close(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkRawFdatasync is the baseline: a record-sized write at the end of a file and one
// fdatasync per record, on the same directory as the WAL benchmarks, with and without
// preallocation of the file.
func BenchmarkRawFdatasync(b *testing.B) {
	for _, payload := range benchPayloads {
		for _, prealloc := range []bool{true, false} {
			b.Run(fmt.Sprintf("payload=%d/prealloc=%t", payload, prealloc), func(b *testing.B) {
				f, err := vfs.Default.Create(filepath.Join(b.TempDir(), "raw.log"))
				if err != nil {
					b.Fatal(err)
				}
				defer f.Close()
				if prealloc {
					if err := f.Allocate(0, DefaultSegmentBytes); err != nil {
						b.Fatal(err)
					}
				}
				buf := make([]byte, recordSize(payload))
				b.SetBytes(int64(payload))
				b.ReportAllocs()
				var off int64
				start := time.Now()
				for b.Loop() {
					if _, err := f.WriteAt(buf, off); err != nil {
						b.Fatal(err)
					}
					if err := f.Sync(); err != nil {
						b.Fatal(err)
					}
					off += int64(len(buf))
				}
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "appends/s")
			})
		}
	}
}

// measureDiskSyncs returns the rate of record-sized appends with one fdatasync each in dir,
// over about 50 ms.
func measureDiskSyncs(b *testing.B, dir string, recordBytes int) float64 {
	f, err := vfs.Default.Create(filepath.Join(dir, "disk-probe"))
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		_ = f.Close()
		_ = vfs.Default.Remove(filepath.Join(dir, "disk-probe"))
	}()
	buf := make([]byte, recordBytes)
	start := time.Now()
	n := 0
	for ; n < 10 || time.Since(start) < 50*time.Millisecond; n++ {
		if _, err := f.WriteAt(buf, int64(n*recordBytes)); err != nil {
			b.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
	}
	return float64(n) / time.Since(start).Seconds()
}
