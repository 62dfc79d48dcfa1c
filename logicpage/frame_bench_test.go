package logicpage

import (
	"fmt"
	"testing"
)

// rowBenchSizes are the row sizes of the row-copy benchmarks: the default row and a full page.
var rowBenchSizes = []int{64, 4096}

// BenchmarkLoadRow is the cache-hit copy of the transaction node: 64-bit atomic loads.
func BenchmarkLoadRow(b *testing.B) {
	for _, n := range rowBenchSizes {
		b.Run(fmt.Sprintf("rowBytes=%d", n), func(b *testing.B) {
			src, dst := AlignedBytes(n), make([]byte, n)
			b.SetBytes(int64(n))
			b.ReportAllocs()
			for b.Loop() {
				LoadRow(dst, src)
			}
		})
	}
}

// BenchmarkStoreRow is the shared-frame write: 64-bit atomic stores.
func BenchmarkStoreRow(b *testing.B) {
	for _, n := range rowBenchSizes {
		b.Run(fmt.Sprintf("rowBytes=%d", n), func(b *testing.B) {
			src, dst := make([]byte, n), AlignedBytes(n)
			b.SetBytes(int64(n))
			b.ReportAllocs()
			for b.Loop() {
				StoreRow(dst, src)
			}
		})
	}
}

// BenchmarkCopyRow is the baseline for LoadRow and StoreRow: the built-in copy, no atomics.
func BenchmarkCopyRow(b *testing.B) {
	for _, n := range rowBenchSizes {
		b.Run(fmt.Sprintf("rowBytes=%d", n), func(b *testing.B) {
			src, dst := AlignedBytes(n), make([]byte, n)
			b.SetBytes(int64(n))
			b.ReportAllocs()
			for b.Loop() {
				copy(dst, src)
			}
		})
	}
}
