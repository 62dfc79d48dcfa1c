package vfs

import (
	"maps"
	"math/bits"
	"math/rand/v2"
	"slices"

	"github.com/weftdb/weft/internal/assert"
)

// sectorBytes is the unit a simulated disk writes atomically: after a crash each sector holds
// either its old durable bytes or the newest bytes written to it, never a mixture.
const sectorBytes = 512

// node is a file or a directory of a FaultFS. Every field is guarded by FaultFS.mu.
//
// Invariants of a directory:
//   - replaying log over synced gives children: synced is what a power loss reverts to, log
//     the entry changes made since, in order.
//   - a directory is named by exactly one parent (directories are never renamed), so the tree
//     of directories has no cycle, before or after a crash.
//
// Invariants of a file:
//   - durable is the content as of the last successful Sync; data is what reads return.
//   - a sector that is neither dirty nor lost holds the same bytes in data and durable wherever
//     both have them, and every sector of data beyond len(durable) is dirty or lost.
//   - dirty and lost are disjoint; no bit is set at or beyond the last sector of data.
type node struct {
	isDir bool

	children map[string]*node // directory: current entries
	synced   map[string]*node // directory: entries as of the last SyncDir
	log      []dirOp          // directory: entry changes since the last SyncDir

	data     []byte   // file: current content, what reads return
	durable  []byte   // file: content as of the last successful Sync
	dirty    []uint64 // file: bit s = sector s written since the last Sync
	lost     []uint64 // file: bit s = sector s whose write a failed Sync dropped
	allocEnd int64    // file: end of the space reserved by Allocate
	links    int      // file: current directory entries naming it
}

// dirOp is one change of a directory's entries: name now refers to node (nil: name removed);
// a rename within the directory also removes oldName in the same, atomic step.
type dirOp struct {
	name    string
	node    *node
	oldName string
}

func newDir() *node {
	return &node{isDir: true, children: map[string]*node{}, synced: map[string]*node{}}
}

func newFile() *node { return &node{} }

// setEntry records op in the directory: applied to children now, to synced at the next
// SyncDir, or at a crash to the extent the crash keeps it.
func (d *node) setEntry(op dirOp) {
	applyDirOp(d.children, op)
	d.log = append(d.log, op)
}

func applyDirOp(entries map[string]*node, op dirOp) {
	if op.oldName != "" {
		delete(entries, op.oldName)
	}
	if op.node == nil {
		delete(entries, op.name)
	} else {
		entries[op.name] = op.node
	}
}

// syncEntries makes every entry change durable.
func (d *node) syncEntries() {
	d.synced = maps.Clone(d.children)
	d.log = nil
}

// crashEntries reverts the directory to its durable entries plus the first keepOps changes of
// its log, which become durable as they are now on the rebooted disk.
func (d *node) crashEntries(keepOps int) {
	entries := maps.Clone(d.synced)
	for _, op := range d.log[:keepOps] {
		applyDirOp(entries, op)
	}
	d.children = entries
	d.syncEntries()
}

// footprint is the space the file takes on the simulated disk.
func (n *node) footprint() int64 { return max(int64(len(n.data)), n.allocEnd) }

// writeAt writes p at off, zero-filling any gap after the end, and marks every sector that
// changed (the gap too) dirty.
func (n *node) writeAt(p []byte, off int64) {
	if len(p) == 0 {
		return
	}
	end := off + int64(len(p))
	lo := min(off, int64(len(n.data)))
	if end > int64(len(n.data)) {
		n.data = resize(n.data, end)
	}
	copy(n.data[off:end], p)
	n.markDirty(lo, end)
}

// truncate changes the length: a shrink forgets the dirty state of the sectors cut off, a growth
// zero-fills and marks the new sectors dirty.
func (n *node) truncate(size int64) {
	old := int64(len(n.data))
	n.data = resize(n.data, size)
	if size > old {
		n.markDirty(old, size)
		return
	}
	firstGone := (size + sectorBytes - 1) / sectorBytes
	clearBitsFrom(n.dirty, firstGone)
	clearBitsFrom(n.lost, firstGone)
}

func (n *node) markDirty(lo, hi int64) {
	for s := lo / sectorBytes; s*sectorBytes < hi; s++ {
		n.dirty = setBit(n.dirty, s)
		clearBit(n.lost, s)
	}
}

// sync makes the current content durable, except sectors a failed Sync dropped: their new
// bytes are still read back (the page cache has them) but never reach the disk, as on Linux
// after an fsync error.
func (n *node) sync() {
	n.durable = resize(n.durable, int64(len(n.data)))
	forEachBit(n.dirty, func(s int64) {
		lo, hi := sectorRange(s, int64(len(n.data)))
		copy(n.durable[lo:hi], n.data[lo:hi])
	})
	clear(n.dirty)
}

// syncFailed drops the unsynced sectors: see sync.
func (n *node) syncFailed() {
	forEachBit(n.dirty, func(s int64) { n.lost = setBit(n.lost, s) })
	clear(n.dirty)
}

// Ways a crash treats the dirty sectors of one file; chosen per file, so that over many seeds
// the extremes come up often, not only 50/50 mixtures.
const (
	keepNone   = iota // every unsynced write lost
	keepAll           // every unsynced write reached the disk
	keepPrefix        // the disk wrote back in file order and stopped part way
	keepSubset        // any subset: the disk reordered its writes
	keepWays
)

// crash replaces the content by what a power loss leaves: the durable content, plus a subset of
// the dirty sectors chosen by rng (none if rng is nil), each either whole or not at all. The
// size is the durable size, extended to the end of any kept sector beyond it.
func (n *node) crash(rng *rand.Rand) {
	var sectors []int64
	forEachBit(n.dirty, func(s int64) { sectors = append(sectors, s) })
	way, cut := keepNone, 0
	if rng != nil && len(sectors) > 0 {
		way = rng.IntN(keepWays)
		if way == keepPrefix {
			cut = rng.IntN(len(sectors) + 1)
		}
	}
	content := slices.Clone(n.durable)
	for i, s := range sectors {
		keep := false
		switch way {
		case keepAll:
			keep = true
		case keepPrefix:
			keep = i < cut
		case keepSubset:
			keep = rng.IntN(2) == 1
		}
		if !keep {
			continue
		}
		lo, hi := sectorRange(s, int64(len(n.data)))
		if hi > int64(len(content)) {
			content = resize(content, hi)
		}
		copy(content[lo:hi], n.data[lo:hi])
		// The page written back held zeros past the end of the file.
		clear(content[hi:min(lo+sectorBytes, int64(len(content)))])
	}
	n.data = content
	n.durable = slices.Clone(content)
	n.dirty = nil
	n.lost = nil
}

// sectorRange is the byte range of sector s within a file of size bytes.
func sectorRange(s, size int64) (lo, hi int64) {
	lo = s * sectorBytes
	hi = min(lo+sectorBytes, size)
	if lo >= hi {
		assert.Failf("vfs: sector %d beyond end %d", s, size)
	}
	return lo, hi
}

// resize returns b with length size, zero-filling any growth (never exposing bytes a shrink
// left in the backing array).
func resize(b []byte, size int64) []byte {
	old := int64(len(b))
	if size <= old {
		return b[:size]
	}
	b = slices.Grow(b, int(size-old))[:size]
	clear(b[old:])
	return b
}

func setBit(set []uint64, i int64) []uint64 {
	for int64(len(set)) <= i/64 {
		set = append(set, 0)
	}
	set[i/64] |= 1 << (i % 64)
	return set
}

func clearBit(set []uint64, i int64) {
	if i/64 < int64(len(set)) {
		set[i/64] &^= 1 << (i % 64)
	}
}

func clearBitsFrom(set []uint64, from int64) {
	for w := from / 64; w < int64(len(set)); w++ {
		if w == from/64 {
			set[w] &= 1<<(from%64) - 1
		} else {
			set[w] = 0
		}
	}
}

func forEachBit(set []uint64, fn func(i int64)) {
	for w, word := range set {
		for word != 0 {
			b := bits.TrailingZeros64(word)
			fn(int64(w)*64 + int64(b))
			word &= word - 1
		}
	}
}
