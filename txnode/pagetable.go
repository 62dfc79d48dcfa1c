package txnode

import (
	"sync/atomic"
	"unsafe"
)

// pageTable maps a page key (table<<32 | page) to a frame: open addressing with linear
// probing over one array of 32-byte slots, each a key, the frame's id, and pointers to its
// metadata and its memory. A hit reads one line of the table and then loads the frame's
// metadata and its row in parallel: the row's address does not wait for the metadata (a
// random hit at 30M rows went table keys, table values, chunk directory, metadata, row, one
// miss after another).
//
// Readers look up without a lock. Writers (insert, delete, grow) hold the cache's mutex. A
// lock-free reader can be wrong in two ways, and both are caught: it can miss a key that a
// concurrent delete is shifting (the caller then takes the slow path, which looks again under
// the mutex), or it can pair a key with a frame id that was just replaced (the caller checks
// the frame's own key after loading it). Growth builds a new table and publishes it with one
// atomic store; readers holding the old one see a snapshot that only misses newer entries.
type pageTable struct {
	cur atomic.Pointer[ptArray]
}

type ptArray struct {
	slots []ptSlot
	mask  uint64
	shift uint
	n     int
}

// ptSlot is one slot, two to a cache line: a key (0 = empty), its frame id, and the frame's
// metadata and memory (whose mem is constant while the frame is in the table: memory is
// replaced only for a frame with no key). A lock-free reader may use meta and mem only
// after checking the frame's key and generation, and that meta.mem is mem.
type ptSlot struct {
	key  atomic.Uint64
	meta atomic.Pointer[frameMeta]
	mem  atomic.Pointer[uint64]
	val  atomic.Int32
	_    int32
}

// set fills slot i from e's fields, key last (the publication). Caller holds the cache mutex.
func (a *ptArray) set(i uint64, key uint64, id int32, meta *frameMeta, mem *uint64) {
	sl := &a.slots[i]
	sl.val.Store(id)
	sl.meta.Store(meta)
	sl.mem.Store(mem)
	sl.key.Store(key)
}

func newPTArray(capPow2 int) *ptArray {
	a := &ptArray{slots: make([]ptSlot, capPow2), mask: uint64(capPow2 - 1)}
	for 1<<(64-a.shift-1) >= capPow2 && a.shift < 63 {
		a.shift++
	}
	return a
}

func (a *ptArray) home(key uint64) uint64 { return (key * 0x9E3779B97F4A7C15) >> a.shift & a.mask }

func newPageTable() *pageTable {
	t := &pageTable{}
	t.cur.Store(newPTArray(16)) // grows with the cache; its bytes count against the budget
	return t
}

// ptSlotBytes is what one slot costs: a key, a frame id and two pointers, padded to 32 bytes.
const ptSlotBytes = int64(unsafe.Sizeof(ptSlot{}))

// bytes is the table's current array memory. Caller holds the cache mutex (or is its
// constructor).
func (t *pageTable) bytes() int64 { return int64(len(t.cur.Load().slots)) * ptSlotBytes }

// growBytes is what the next insert adds to bytes (0 unless it grows the table). Caller holds
// the cache mutex.
func (t *pageTable) growBytes() int64 {
	a := t.cur.Load()
	if (a.n+1)*4 > len(a.slots)*3 {
		return int64(len(a.slots)) * ptSlotBytes // doubles
	}
	return 0
}

// lookup returns the frame id of key, or -1. Any goroutine may call it.
func (t *pageTable) lookup(key uint64) int32 {
	if sl := t.find(key); sl != nil {
		return sl.val.Load()
	}
	return -1
}

// find returns key's slot, or nil. Any goroutine may call it; a lock-free caller checks
// what it loads from the slot against the frame (see ptSlot).
func (t *pageTable) find(key uint64) *ptSlot {
	a := t.cur.Load()
	for i := a.home(key); ; i = (i + 1) & a.mask {
		k := a.slots[i].key.Load()
		if k == key {
			return &a.slots[i]
		}
		if k == 0 {
			return nil
		}
	}
}

// insert adds key -> frame id (with its metadata and memory); key must be absent. Caller
// holds the cache mutex.
func (t *pageTable) insert(key uint64, id int32, meta *frameMeta, mem *uint64) {
	a := t.cur.Load()
	if (a.n+1)*4 > len(a.slots)*3 {
		a = t.grow(a)
	}
	i := a.home(key)
	for a.slots[i].key.Load() != 0 {
		i = (i + 1) & a.mask
	}
	a.set(i, key, id, meta, mem)
	a.n++
}

func (t *pageTable) grow(old *ptArray) *ptArray {
	a := newPTArray(len(old.slots) * 2)
	for i := range old.slots {
		if k := old.slots[i].key.Load(); k != 0 {
			j := a.home(k)
			for a.slots[j].key.Load() != 0 {
				j = (j + 1) & a.mask
			}
			o := &old.slots[i]
			a.set(j, k, o.val.Load(), o.meta.Load(), o.mem.Load())
			a.n++
		}
	}
	t.cur.Store(a)
	return a
}

// remove deletes key with backward-shift deletion (no tombstones). Caller holds the cache mutex.
func (t *pageTable) remove(key uint64) {
	a := t.cur.Load()
	i := a.home(key)
	for {
		k := a.slots[i].key.Load()
		if k == 0 {
			return
		}
		if k == key {
			break
		}
		i = (i + 1) & a.mask
	}
	// Shift later members of the probe run back into the hole.
	for j := (i + 1) & a.mask; ; j = (j + 1) & a.mask {
		k := a.slots[j].key.Load()
		if k == 0 {
			break
		}
		h := a.home(k)
		// Move k to i if its home is not in the cyclic range (i, j].
		if (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
			o := &a.slots[j]
			a.set(i, k, o.val.Load(), o.meta.Load(), o.mem.Load())
			i = j
		}
	}
	a.slots[i].key.Store(0)
	a.slots[i].meta.Store(nil) // do not keep freed frame memory reachable
	a.slots[i].mem.Store(nil)
	a.n--
}
