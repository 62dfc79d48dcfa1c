package txnode

import "testing"

// BenchmarkPageTableFind is the page-table half of a random cache hit at 30M rows: a table of
// 468,750 pages (a 32 MiB array of slots), random finds of present keys, each followed by a
// load through the frame's metadata pointer (as Get's key check does). The baseline for a
// direct per-table page array (bench/README.md, "Cache hits at 30M rows").
//
//	go test ./txnode -run '^$' -bench PageTableFind -benchtime 1s -count 3
func BenchmarkPageTableFind(b *testing.B) {
	const pages = 30_000_000 / 64
	metas := make([]frameMeta, 1024)
	mem := new(uint64)
	pt := newPageTable()
	for p := range uint64(pages) {
		pt.insert(pageKey(1, p), int32(p), &metas[p%uint64(len(metas))], mem)
	}
	b.ReportAllocs()
	x := uint64(88172645463325252)
	var sum uint64
	for b.Loop() {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		sum += pt.find(pageKey(1, x%pages)).meta.Load().key.Load()
	}
	if sum == 1 {
		b.Log(sum)
	}
}
