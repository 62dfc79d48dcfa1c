// Package logicpage is the geometry of Weft's logical pages and the in-memory operations on
// them: page frames over caller-owned memory, the present/valid/dirty masks, lock-free row
// copies, and the extraction and application of sparse segments. It does no IO and holds no
// locks; the transaction node's cache, the storage node's disk page cache, the wire encoder and
// the WAL all build on it.
//
// # Pages
//
// A table's rows have a fixed size R (8..4096 bytes, a multiple of 8). Row id i lives in logical
// page i/64, slot i%64 (PageOf, RowID). A table has at most TablePagesMax = 2^30 pages, row ids
// below TableRowsMax = 2^36; the formats can name pages up to PageMax = 2^58-1, and a page
// between the two is refused as malformed by the storage engine. A logical page is the 64 rows laid end to end, 64*R
// bytes; a frame is a view of one page in caller-owned memory plus its masks:
//
//	Frame.Rows: 64*R bytes, 8-byte aligned (4 KiB for R = 64)
//	+---------+---------+---------+---------+-----+---------+
//	| slot 0  | slot 1  | slot 2  | slot 3  | ... | slot 63 |
//	+---------+---------+---------+---------+-----+---------+
//	0         R         2R        3R        4R    63R       64R
//
//	Frame.Masks: one uint64 each, bit s = slot s
//	  Present  the row exists
//	  Valid    the row's bytes are in this cache (transaction node only)
//	  Dirty    changed, not yet sent to the storage node
//
//	Disk page: the 64*R row bytes, then padding up to a multiple of 4 KiB; no header
//	(R = 64: 4096 bytes; R = 72: 4608 + 3584 padding = 8192 bytes)
//
// # Sparse segments
//
// A segment carries only the rows that matter: a data mask whose rows follow, in slot order,
// and a clear mask of rows that are (or become) absent and carry no bytes. It is the unit of IO
// in both directions and of the WAL; the wire and WAL formats add the table id and their own
// framing around these fields.
//
//	Segment of page p, data = 0b1101 (slots 0, 2, 3), clear = 0b0010 (slot 1)
//	+--------+-----------+------------+---------+---------+---------+
//	| Page p | Data mask | Clear mask | slot 0  | slot 2  | slot 3  |
//	+--------+-----------+------------+---------+---------+---------+
//	                                   \___ Rows: popcount(Data)*R bytes, slot order ___/
//
//	Data & Clear == 0; len(Rows) == popcount(Data)*R; Page <= PageMax (CheckSegment)
//
// Extraction (Frame.Gather) copies nothing: it returns slices of the frame, one per run of
// adjacent slots, ready for a writev. Application (Frame.Apply, Frame.ApplyOnly) copies each run
// of rows with one copy, sets Present for data and clears it (and zeroes the rows) for clear.
// ApplyOnly writes only the slots of a given mask: the transaction node's fill writes only
// slots still invalid.
//
// # Memory and concurrency
//
// Frames hold no memory of their own. Rows live in slabs allocated with AlignedBytes (a
// []uint64 viewed as bytes: 8-byte aligned, no pointers, never scanned by the garbage
// collector) and masks in a []Masks slab. A cache that serves reads without locks copies rows
// with LoadRow (64-bit atomic loads) and writes them with StoreRow or the Shared forms of Apply
// (64-bit atomic stores): the race detector sees no race, and a reader sees each 8-byte word
// either old or new, so a version check around the copy suffices. Plain Apply writes with
// memmove and is several times cheaper for memory that only its latch holder touches.
//
// # Measured
//
// 2-core dev machine (AMD EPYC, linux/amd64, go1.26.8), 2026-11-30, R = 64, medians of 6 runs:
//
//	go test ./logicpage -run '^$' -bench . -count 6 | tee /tmp/logicpage_bench.txt
//
//	benchmark                               median     throughput  note
//	ExtractApply/rows=1                      28.4 ns     2.3 GB/s  Gather, land in a buffer, Apply
//	ExtractApply/rows=8                      41.3 ns    12.4 GB/s  8 adjacent rows: one slice
//	ExtractApply/rows=64                      102 ns    40.1 GB/s  full page: one slice
//	ExtractApply/rows=32/layout=spread        435 ns     4.7 GB/s  every other slot: 32 slices
//	ExtractApplyShared/rows=1                49.0 ns     1.3 GB/s  ApplyShared: atomic stores
//	ExtractApplyShared/rows=8                 244 ns     2.1 GB/s  (runs spread 178..352 ns)
//	ExtractApplyShared/rows=64               1220 ns     3.4 GB/s
//	ExtractApplyShared/rows=32/layout=spread  980 ns     2.1 GB/s
//	Gather/rows=1, rows=8, rows=64        4.1-4.9 ns               one slice, no allocation
//	Gather/rows=32/layout=spread              142 ns               32 slices
//	CheckSegment                              3.7 ns
//	LoadRow/rowBytes=64                       5.6 ns    11.4 GB/s  64-bit atomic loads
//	StoreRow/rowBytes=64                     17.6 ns     3.6 GB/s  64-bit atomic stores (XCHG)
//	CopyRow/rowBytes=64 (baseline: copy)      2.9 ns    22.4 GB/s
//	LoadRow/rowBytes=4096                     110 ns    37.1 GB/s
//	StoreRow/rowBytes=4096                   1130 ns     3.6 GB/s
//	CopyRow/rowBytes=4096 (baseline: copy)   36.4 ns   112.6 GB/s
//
// Every path above allocates nothing. An atomic load is a plain MOV on amd64, so LoadRow costs
// about twice a copy for one row and three times for a page; an atomic store is a locked XCHG,
// about six times a copy for one row and thirty times for a page, which is why Apply (plain
// stores) and ApplyShared (atomic stores) are separate methods.
package logicpage
