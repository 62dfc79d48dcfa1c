package storenode

import (
	"fmt"

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
// Memory grows with the pages present: a leaf (4 KiB) or a middle node (8 KiB) is allocated on
// the first frame of its range and freed when its last frame goes, a table's root (8 KiB) on
// its first frame and freed with its last. So the index holds at most 20 KiB per frame in the
// worst case (frames spread one per 1M pages), and about 4 bytes a page for a table cached
// densely; it is not charged against the cache budget (frameOverheadBytes is charged per
// frame). The first frame of a 1,024-page range allocates on the commit path.
//
// The index is guarded by Engine.mu, like the rest of the cache.
type pageIndex struct {
	tables map[uint32]*tableIndex
	last   *tableIndex // the table last looked up or inserted, or nil
	n      int         // frames indexed
}

const (
	pixBits  = 10
	pixFan   = 1 << pixBits
	pixMask  = pixFan - 1
	pixPages = 1 << (3 * pixBits) // pages an index covers: logicpage.TablePagesMax
)

type tableIndex struct {
	id   uint32
	n    int // frames indexed for the table
	root [pixFan]*pixMid
}

type pixMid struct {
	n      int
	leaves [pixFan]*pixLeaf
}

type pixLeaf struct {
	n   int
	ids [pixFan]int32 // frame id + 1; 0 means none
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
	m := t.root[page>>(2*pixBits)]
	if m == nil {
		return 0, false
	}
	l := m.leaves[(page>>pixBits)&pixMask]
	if l == nil {
		return 0, false
	}
	v := l.ids[page&pixMask]
	return v - 1, v != 0
}

// set indexes frame id under key, which must not be indexed.
func (x *pageIndex) set(key uint64, id int32) {
	page := key & (1<<32 - 1)
	if page >= pixPages {
		assert.Failf("storenode: page %d beyond the page index", page)
	}
	tid := uint32(key >> 32)
	t := x.table(tid)
	if t == nil {
		t = &tableIndex{id: tid}
		x.tables[tid] = t
		x.last = t
	}
	m := t.root[page>>(2*pixBits)]
	if m == nil {
		m = new(pixMid)
		t.root[page>>(2*pixBits)] = m
	}
	l := m.leaves[(page>>pixBits)&pixMask]
	if l == nil {
		l = new(pixLeaf)
		m.leaves[(page>>pixBits)&pixMask] = l
		m.n++
	}
	if l.ids[page&pixMask] != 0 {
		assert.Failf("storenode: page %#x indexed twice", key)
	}
	l.ids[page&pixMask] = id + 1
	l.n++
	t.n++
	x.n++
}

// del removes key, which must be indexed, freeing the nodes it leaves empty.
func (x *pageIndex) del(key uint64) {
	page := key & (1<<32 - 1)
	tid := uint32(key >> 32)
	t := x.table(tid)
	var m *pixMid
	var l *pixLeaf
	if t != nil && page < pixPages {
		if m = t.root[page>>(2*pixBits)]; m != nil {
			l = m.leaves[(page>>pixBits)&pixMask]
		}
	}
	if l == nil || l.ids[page&pixMask] == 0 {
		assert.Failf("storenode: delete of unindexed page %#x", key)
		return
	}
	l.ids[page&pixMask] = 0
	x.n--
	if l.n--; l.n == 0 {
		m.leaves[(page>>pixBits)&pixMask] = nil
		if m.n--; m.n == 0 {
			t.root[page>>(2*pixBits)] = nil
		}
	}
	if t.n--; t.n == 0 {
		delete(x.tables, tid)
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
			for _, v := range l.ids {
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
	total := 0
	if x.last != nil && x.tables[x.last.id] != x.last {
		return 0, fmt.Errorf("page index remembers table %d, which it does not hold", x.last.id)
	}
	for id, t := range x.tables {
		if t.id != id {
			return 0, fmt.Errorf("page index of table %d filed under %d", t.id, id)
		}
		frames := 0
		for i, m := range t.root {
			if m == nil {
				continue
			}
			leaves := 0
			for j, l := range m.leaves {
				if l == nil {
					continue
				}
				leaves++
				n := 0
				for _, v := range l.ids {
					if v != 0 {
						n++
					}
				}
				if n != l.n || n == 0 {
					return 0, fmt.Errorf("page index leaf %d/%d of table %d counts %d of %d frames", i, j, id, l.n, n)
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
	return total, nil
}
