package txnode

import (
	"sync/atomic"
)

// pageTable maps a page key (table<<32 | page) to a frame id: open addressing with linear
// probing over integer arrays, no pointers inside.
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
	keys  []atomic.Uint64 // 0 = empty
	vals  []atomic.Int32
	mask  uint64
	shift uint
	n     int
}

func newPTArray(capPow2 int) *ptArray {
	a := &ptArray{keys: make([]atomic.Uint64, capPow2), vals: make([]atomic.Int32, capPow2), mask: uint64(capPow2 - 1)}
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

// ptSlotBytes is what one slot costs: a key and a frame id.
const ptSlotBytes = 8 + 4

// bytes is the table's current array memory. Caller holds the cache mutex (or is its
// constructor).
func (t *pageTable) bytes() int64 { return int64(len(t.cur.Load().keys)) * ptSlotBytes }

// growBytes is what the next insert adds to bytes (0 unless it grows the table). Caller holds
// the cache mutex.
func (t *pageTable) growBytes() int64 {
	a := t.cur.Load()
	if (a.n+1)*4 > len(a.keys)*3 {
		return int64(len(a.keys)) * ptSlotBytes // doubles
	}
	return 0
}

// lookup returns the frame id of key, or -1. Any goroutine may call it.
func (t *pageTable) lookup(key uint64) int32 {
	a := t.cur.Load()
	for i := a.home(key); ; i = (i + 1) & a.mask {
		k := a.keys[i].Load()
		if k == key {
			return a.vals[i].Load()
		}
		if k == 0 {
			return -1
		}
	}
}

// insert adds key -> id; key must be absent. Caller holds the cache mutex.
func (t *pageTable) insert(key uint64, id int32) {
	a := t.cur.Load()
	if (a.n+1)*4 > len(a.keys)*3 {
		a = t.grow(a)
	}
	i := a.home(key)
	for a.keys[i].Load() != 0 {
		i = (i + 1) & a.mask
	}
	a.vals[i].Store(id)
	a.keys[i].Store(key) // publish after the value
	a.n++
}

func (t *pageTable) grow(old *ptArray) *ptArray {
	a := newPTArray(len(old.keys) * 2)
	for i := range old.keys {
		if k := old.keys[i].Load(); k != 0 {
			j := a.home(k)
			for a.keys[j].Load() != 0 {
				j = (j + 1) & a.mask
			}
			a.vals[j].Store(old.vals[i].Load())
			a.keys[j].Store(k)
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
		k := a.keys[i].Load()
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
		k := a.keys[j].Load()
		if k == 0 {
			break
		}
		h := a.home(k)
		// Move k to i if its home is not in the cyclic range (i, j].
		if (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
			a.vals[i].Store(a.vals[j].Load())
			a.keys[i].Store(k)
			i = j
		}
	}
	a.keys[i].Store(0)
	a.n--
}
