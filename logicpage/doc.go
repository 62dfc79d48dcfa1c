// Package logicpage is the geometry of Weft's logical pages and the in-memory operations on
// them: page frames over caller-owned memory, the present/valid/dirty masks, lock-free row
// copies, and the extraction and application of sparse segments (the unit of IO in both
// directions and of the WAL). The transaction node's cache, the storage node's disk page
// cache, the wire encoder and the WAL all build on it.
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
//	Segment of page p, data = 0b1101 (slots 0, 2, 3), clear = 0b0010 (slot 1)
//	+--------+-----------+------------+---------+---------+---------+
//	| Page p | Data mask | Clear mask | slot 0  | slot 2  | slot 3  |
//	+--------+-----------+------------+---------+---------+---------+
//	                                   \___ Rows: popcount(Data)*R bytes, slot order ___/
//
// Rules:
//
//   - Rows are R bytes, 8..4096, a multiple of 8. Row id i is page i/64, slot i%64 (PageOf,
//     RowID). A table has at most TablePagesMax (2^30) pages, row ids below TableRowsMax;
//     the formats name pages up to PageMax (2^58-1), and the storage engine refuses a page
//     between the two as malformed.
//   - A segment has Data & Clear == 0, len(Rows) == popcount(Data)*R and Page <= PageMax
//     (CheckSegment). Clear rows carry no bytes; the wire and WAL add the table id and
//     their own framing.
//   - No IO, no locks. Frames hold no memory: rows live in AlignedBytes slabs (no pointers,
//     never scanned by the garbage collector), masks in a []Masks slab.
//   - Frame.Gather copies nothing: its slices alias the frame. Apply sets Present for data
//     rows and clears Present and zeroes the rows for clear ones; ApplyOnly writes only the
//     slots of its mask (a fill writes only slots still invalid).
//   - Memory read lock-free is read with LoadRow and written with StoreRow or the Shared
//     forms of Apply (64-bit atomics: each word old or new, so readers need a version check
//     around the copy). Plain Apply is for memory only its latch holder touches.
//
// Reasons, history and measurements: docs/logicpage.md.
package logicpage
