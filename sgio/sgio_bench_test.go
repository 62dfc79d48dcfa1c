package sgio

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"testing"

	"github.com/weftdb/weft/base"
)

// benchBatches are the commit batches of the benchmarks: 128 one-row segments (random
// updates) and 16 full pages (sequential writes), 64-byte rows.
var benchBatches = []struct {
	name             string
	segs, rowsPerSeg int
}{
	{"batch=128x1row", 128, 1},
	{"batch=16x64row", 16, 64},
}

// commitBatch returns a commit of segs segments of rowsPerSeg 64-byte rows each, with rows
// from one buffer (the batch's own buffer, as the commit pipeline builds it); the benchmarks'
// and the allocation tests' batch.
func commitBatch(segs, rowsPerSeg int) *Commit {
	const rowBytes = 64
	buf := rows(segs*rowsPerSeg, rowBytes, 1)
	c := &Commit{Owner: 7, Seq: 1, Fences: []base.Fence{{Table: 1, Epoch: 3}}}
	mask := ^uint64(0) >> (64 - rowsPerSeg)
	for i := range segs {
		c.Segments = append(c.Segments, base.Segment{
			Table: 1, RowBytes: rowBytes, Page: uint64(i) * 3, Data: mask,
			Rows: buf[i*rowsPerSeg*rowBytes : (i+1)*rowsPerSeg*rowBytes],
		})
	}
	return c
}

// BenchmarkCommitEncode encodes a commit batch into a frame with its CRC, without IO:
// mode=gather is the Writer as configured by default (row slices under DefaultCopyBelow
// copied, longer ones by reference), mode=ref is the Writer gathering every row slice by
// reference (CopyBelow -1), mode=copy is the baseline AppendFrame into a reused contiguous
// buffer.
func BenchmarkCommitEncode(b *testing.B) {
	for _, bb := range benchBatches {
		c := commitBatch(bb.segs, bb.rowsPerSeg)
		size := int64(HeaderSize + c.BodySize())
		for _, mode := range []struct {
			name      string
			copyBelow int
		}{{"gather", 0}, {"ref", -1}} {
			b.Run(bb.name+"/mode="+mode.name, func(b *testing.B) {
				w := Writer{CopyBelow: mode.copyBelow}
				b.SetBytes(size)
				b.ReportAllocs()
				for b.Loop() {
					w.Append(1, c)
					w.Reset()
				}
			})
		}
		b.Run(bb.name+"/mode=copy", func(b *testing.B) {
			buf := make([]byte, 0, size)
			b.SetBytes(size)
			b.ReportAllocs()
			for b.Loop() {
				buf = AppendFrame(buf[:0], 1, c)
			}
		})
	}
}

// BenchmarkCommitWrite encodes a commit batch and writes it to a loopback TCP socket (drained
// by another goroutine): the sender's whole cost, syscall included. mode=gather and mode=ref
// are Writer.WriteTo (one writev), mode=copy is AppendFrame and one Write.
func BenchmarkCommitWrite(b *testing.B) {
	for _, bb := range benchBatches {
		c := commitBatch(bb.segs, bb.rowsPerSeg)
		size := int64(HeaderSize + c.BodySize())
		for _, mode := range []struct {
			name      string
			copyBelow int
		}{{"gather", 0}, {"ref", -1}, {"copy", 0}} {
			b.Run(bb.name+"/mode="+mode.name, func(b *testing.B) {
				client, server := tcpPair(b)
				go func() { _, _ = io.Copy(io.Discard, server) }()
				w := Writer{CopyBelow: mode.copyBelow}
				var buf []byte
				b.SetBytes(size)
				b.ReportAllocs()
				for b.Loop() {
					var err error
					if mode.name == "copy" {
						buf = AppendFrame(buf[:0], 1, c)
						_, err = client.Write(buf)
					} else {
						w.Append(1, c)
						_, err = w.WriteTo(client)
					}
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkCommitDecode decodes a commit frame (header checks and CRC) and walks its segments:
// mode=view is Decode + ViewCommit + SegmentIter (no allocation), mode=parse is Decode +
// Commit.Parse into a reused Commit.
func BenchmarkCommitDecode(b *testing.B) {
	for _, bb := range benchBatches {
		c := commitBatch(bb.segs, bb.rowsPerSeg)
		frame := AppendFrame(nil, 1, c)
		b.Run(bb.name+"/mode=view", func(b *testing.B) {
			b.SetBytes(int64(len(frame)))
			b.ReportAllocs()
			rowBytes := 0
			for b.Loop() {
				f, _, err := Decode(frame, MaxBodyLimit)
				if err != nil {
					b.Fatal(err)
				}
				v, err := ViewCommit(f.Body)
				if err != nil {
					b.Fatal(err)
				}
				var s base.Segment
				it := v.Segments() // outside the for: a loop variable would be copied each round
				for it.Next(&s) {
					rowBytes += len(s.Rows)
				}
			}
			if rowBytes == 0 {
				b.Fatal("no rows")
			}
		})
		b.Run(bb.name+"/mode=parse", func(b *testing.B) {
			var got Commit
			b.SetBytes(int64(len(frame)))
			b.ReportAllocs()
			for b.Loop() {
				f, _, err := Decode(frame, MaxBodyLimit)
				if err != nil {
					b.Fatal(err)
				}
				if err := got.Parse(f.Body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkClientCall measures pipelined Ping round trips over loopback TCP against the test
// server, from 1 goroutine and from 64; req/write is the sender's batching factor.
func BenchmarkClientCall(b *testing.B) {
	for _, conc := range []int{1, 64} {
		b.Run(fmt.Sprintf("goroutines=%d", conc), func(b *testing.B) {
			s := newTestServer(b, nil)
			c := dialTest(b, s)
			ctx := context.Background()
			b.ReportAllocs()
			b.SetParallelism(max(1, conc/max(1, testingProcs())))
			before := c.Stats()
			if conc == 1 {
				for b.Loop() {
					if _, err := c.Call(ctx, &Ping{}); err != nil {
						b.Fatal(err)
					}
				}
			} else {
				b.RunParallel(func(pb *testing.PB) {
					ping := &Ping{}
					for pb.Next() {
						if _, err := c.Call(ctx, ping); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			after := c.Stats()
			if w := after.Writes - before.Writes; w > 0 {
				b.ReportMetric(float64(after.Requests-before.Requests)/float64(w), "req/write")
			}
		})
	}
}

func testingProcs() int { return runtime.GOMAXPROCS(0) }
