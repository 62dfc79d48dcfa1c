package storenode

import (
	"fmt"
	"unsafe"

	"github.com/weftdb/weft/internal/assert"
)

// pageIndex maps a cached (table, page) to its frame id: per table, a three-level radix tree
// over the page number (10 bits a level: logicpage.TablePagesMax is 2^30), whose leaves are
// arrays of 1,024 frame ids (id+1, 0 = not cached) that hold no Go pointers. Row ids are dense,
// so a table's cached pages share few leaves and the upper levels stay in the CPU cache: a
// lookup is one table compare (the last table looked up is remembered) and three dependent
// loads, of which only the leaf's is likely to miss. A Go map at 470K keys took a random probe
// and about two cache misses per lookup.
//
// Memory grows with the pages present and is charged to the cache budget (pageIndex.bytes;
// pageCache.alloc evicts to make room for the nodes a new frame needs, as for the frame): a
// leaf (4 KiB) is allocated on the first frame of its 1,024 pages and freed with the last; a
// middle node and a table's root are small and hold slices grown by doubling to the highest
// leaf or middle node needed (at most 10 KiB and 8 KiB), freed with their last frame. A table
// cached densely from page 0 costs about 4 bytes a page; the sparsest case (frames one per
// million pages) about 14 KiB a frame, which the budget then holds as fewer frames. The first
// frame of a 1,024-page range allocates on the commit path.
//
// The index is guarded by Engine.mu, like the rest of the cache.
type pageIndex struct {
	tables map[uint32]*tableIndex
	last   *tableIndex // the table last looked up or inserted, or nil
	n      int         // frames indexed
	bytes  int64       // bytes of the nodes and their slices, charged to the cache budget
}

const (
	pixBits  = 10
	pixFan   = 1 << pixBits
	pixMask  = pixFan - 1
	pixPages = 1 << (3 * pixBits) // pages an index covers: logicpage.TablePagesMax
)

// tableIndex is a table's root: root[i] covers pages [i<<20, (i+1)<<20), grown to the highest
// middle node needed (a table cached from page 0 holds a root of one).
type tableIndex struct {
	id   uint32
	n    int // frames indexed for the table
	root []*pixMid
}

// pixMid covers 2^20 pages: leaves[j] the 1,024 pages from j<<10 of its range, grown to the
// highest leaf needed; counts[j] the frames of leaves[j].
type pixMid struct {
	n      int // leaves present
	leaves []*pixLeaf
	counts []uint16
}

// pixLeaf holds the frame ids (id+1; 0 means none) of 1,024 pages: exactly 4 KiB, a Go size
// class, so what is charged is what is allocated.
type pixLeaf [pixFan]int32

const (
	pixTableBytes = int64(unsafe.Sizeof(tableIndex{}))
	pixMidBytes   = int64(unsafe.Sizeof(pixMid{}))
	pixLeafBytes  = int64(unsafe.Sizeof(pixLeaf{}))
	pixPtrBytes   = int64(unsafe.Sizeof((*pixMid)(nil)))
	pixSlotBytes  = pixPtrBytes + 2 // a mid's leaf pointer and count
)

// pixGrow is the length a root or a middle node's slices grow to from cap have to hold index
// i: doubling, at most pixFan, so growth is amortised and bounded.
func pixGrow(have, i int) int {
	if i < have {
		return have
	}
	return min(pixFan, max(i+1, 2*have))
}

func newPageIndex() pageIndex { return pageIndex{tables: make(map[uint32]*tableIndex)} }

func (x *pageIndex) table(id uint32) *tableIndex {
	if t := x.last; t != nil && t.id == id {
		return t
	}
	t := x.tables[id]
	if t != nil {
		x.last = t
	}
	return t
}

// get returns the frame caching key.
func (x *pageIndex) get(key uint64) (int32, bool) {
	page := key & (1<<32 - 1)
	t := x.table(uint32(key >> 32))
	if t == nil || page >= pixPages {
		return 0, false
	}
	i := int(page >> (2 * pixBits))
	if i >= len(t.root) {
		return 0, false
	}
	m := t.root[i]
	if m == nil {
		return 0, false
	}
	j := int((page >> pixBits) & pixMask)
	if j >= len(m.leaves) {
		return 0, false
	}
	l := m.leaves[j]
	if l == nil {
		return 0, false
	}
	v := l[page&pixMask]
	return v - 1, v != 0
}

// growth reports the bytes set(key) would add to the index: the nodes and slice growth the
// first frame of a range needs. It does not allocate.
func (x *pageIndex) growth(key uint64) int64 {
	page := key & (1<<32 - 1)
	if page >= pixPages {
		return 0
	}
	i, j := int(page>>(2*pixBits)), int((page>>pixBits)&pixMask)
	var b int64
	t := x.table(uint32(key >> 32))
	var m *pixMid
	if t == nil {
		b += pixTableBytes
	}
	if t != nil && i < len(t.root) {
		m = t.root[i]
	} else {
		have := 0
		if t != nil {
			have = cap(t.root)
		}
		b += int64(pixGrow(have, i)-have) * pixPtrBytes
	}
	if m == nil {
		b += pixMidBytes
	}
	if m != nil && j < len(m.leaves) {
		if m.leaves[j] != nil {
			return b
		}
	} else {
		have := 0
		if m != nil {
			have = cap(m.leaves)
		}
		b += int64(pixGrow(have, j)-have) * pixSlotBytes
	}
	return b + pixLeafBytes
}

// set indexes frame id under key, which must not be indexed.
func (x *pageIndex) set(key uint64, id int32) {
	page := key & (1<<32 - 1)
	if page >= pixPages {
		assert.Failf("storenode: page %d beyond the page index", page)
		return
	}
	tid := uint32(key >> 32)
	t := x.table(tid)
	if t == nil {
		t = &tableIndex{id: tid}
		x.tables[tid] = t
		x.last = t
		x.bytes += pixTableBytes
	}
	i, j := int(page>>(2*pixBits)), int((page>>pixBits)&pixMask)
	if i >= len(t.root) {
		if i >= cap(t.root) {
			n := pixGrow(cap(t.root), i)
			x.bytes += int64(n-cap(t.root)) * pixPtrBytes
			t.root = append(make([]*pixMid, 0, n), t.root...)
		}
		t.root = t.root[:i+1]
	}
	m := t.root[i]
	if m == nil {
		m = new(pixMid)
		t.root[i] = m
		x.bytes += pixMidBytes
	}
	if j >= len(m.leaves) {
		if j >= cap(m.leaves) {
			n := pixGrow(cap(m.leaves), j)
			x.bytes += int64(n-cap(m.leaves)) * pixSlotBytes
			m.leaves = append(make([]*pixLeaf, 0, n), m.leaves...)
			m.counts = append(make([]uint16, 0, n), m.counts...)
		}
		m.leaves, m.counts = m.leaves[:j+1], m.counts[:j+1]
	}
	l := m.leaves[j]
	if l == nil {
		l = new(pixLeaf)
		m.leaves[j] = l
		m.n++
		x.bytes += pixLeafBytes
	}
	if l[page&pixMask] != 0 {
		assert.Failf("storenode: page %#x indexed twice", key)
	}
	l[page&pixMask] = id + 1
	m.counts[j]++
	t.n++
	x.n++
}

// del removes key, which must be indexed, freeing the nodes it leaves empty.
func (x *pageIndex) del(key uint64) {
	page := key & (1<<32 - 1)
	tid := uint32(key >> 32)
	t := x.table(tid)
	i, j := int(page>>(2*pixBits)), int((page>>pixBits)&pixMask)
	var m *pixMid
	var l *pixLeaf
	if t != nil && page < pixPages && i < len(t.root) {
		if m = t.root[i]; m != nil && j < len(m.leaves) {
			l = m.leaves[j]
		}
	}
	if l == nil || l[page&pixMask] == 0 {
		assert.Failf("storenode: delete of unindexed page %#x", key)
		return
	}
	l[page&pixMask] = 0
	x.n--
	if m.counts[j]--; m.counts[j] == 0 {
		m.leaves[j] = nil
		x.bytes -= pixLeafBytes
		if m.n--; m.n == 0 {
			t.root[i] = nil
			x.bytes -= pixMidBytes + int64(cap(m.leaves))*pixSlotBytes
		}
	}
	if t.n--; t.n == 0 {
		delete(x.tables, tid)
		x.bytes -= pixTableBytes + int64(cap(t.root))*pixPtrBytes
		if x.last == t {
			x.last = nil
		}
	}
}

// tableFrames appends the frames of table to dst, in page order: O(frames of the table and
// the leaves that hold them).
func (x *pageIndex) tableFrames(table uint32, dst []int32) []int32 {
	t := x.tables[table]
	if t == nil {
		return dst
	}
	for _, m := range t.root {
		if m == nil {
			continue
		}
		for _, l := range m.leaves {
			if l == nil {
				continue
			}
			for _, v := range l {
				if v != 0 {
					dst = append(dst, v-1)
				}
			}
		}
	}
	return dst
}

// verify checks the index's counts against its entries and returns the entries found.
func (x *pageIndex) verify() (int, error) {
	total, bytes := 0, int64(0)
	if x.last != nil && x.tables[x.last.id] != x.last {
		return 0, fmt.Errorf("page index remembers table %d, which it does not hold", x.last.id)
	}
	for id, t := range x.tables {
		if t.id != id {
			return 0, fmt.Errorf("page index of table %d filed under %d", t.id, id)
		}
		frames := 0
		bytes += pixTableBytes + int64(cap(t.root))*pixPtrBytes
		for i, m := range t.root {
			if m == nil {
				continue
			}
			if len(m.counts) != len(m.leaves) || cap(m.counts) != cap(m.leaves) {
				return 0, fmt.Errorf("page index node %d of table %d: %d/%d counts for %d/%d leaves", i, id, len(m.counts), cap(m.counts), len(m.leaves), cap(m.leaves))
			}
			bytes += pixMidBytes + int64(cap(m.leaves))*pixSlotBytes
			leaves := 0
			for j, l := range m.leaves {
				if l == nil {
					if m.counts[j] != 0 {
						return 0, fmt.Errorf("page index leaf %d/%d of table %d absent, counting %d frames", i, j, id, m.counts[j])
					}
					continue
				}
				leaves++
				bytes += pixLeafBytes
				n := 0
				for _, v := range l {
					if v != 0 {
						n++
					}
				}
				if n != int(m.counts[j]) || n == 0 {
					return 0, fmt.Errorf("page index leaf %d/%d of table %d counts %d of %d frames", i, j, id, m.counts[j], n)
				}
				frames += n
			}
			if leaves != m.n || leaves == 0 {
				return 0, fmt.Errorf("page index node %d of table %d counts %d of %d leaves", i, id, m.n, leaves)
			}
		}
		if frames != t.n || frames == 0 {
			return 0, fmt.Errorf("page index of table %d counts %d of %d frames", id, t.n, frames)
		}
		total += frames
	}
	if total != x.n {
		return 0, fmt.Errorf("page index counts %d of %d frames", x.n, total)
	}
	if bytes != x.bytes {
		return 0, fmt.Errorf("page index counts %d of %d bytes", x.bytes, bytes)
	}
	return total, nil
}
