package bitmaptree

// Invariants of a Tree t (checked by verify, which tests and invariant builds run):
//
//  1. t.h is the level of the root node; 0 means nothing is allocated and every id is clear.
//     A node at level l covers 64^(l+1) ids, so the tree covers [0, Cap()) = [0, 64^(t.h+1)).
//     Ids at or above Cap() are clear.
//  2. Every initialised level l holds two shared nodes that are never written: node emptyRef
//     (every id below it clear) and node fullRef (every id below it set). A child ref, or the
//     root, that names one of them stands for a whole empty or full subtree at no memory cost;
//     Set and Clear copy a shared node into a private one before writing below it, and skip the
//     copy when the shared node already has the wanted value. Queries read shared nodes like
//     any other, so they need no special case. Nothing links fullRef now: only the removed
//     loader (Unmarshal) made whole full subtrees shared; Set and SetWord fill private nodes.
//     The node and its cases stay, allocated and verified, for a future bulk load.
//  3. For node n at level l and child c (a leaf word when l == 1): bit c of any(n) is set iff
//     the child holds a set id, and bit c of notFull(n) is set iff the child holds a clear id.
//  4. t.count is the number of set ids.
//  5. Nodes are never freed or moved before Reset; the slices holding them may be reallocated
//     by append, so code indexes them afresh after any call that can allocate. t.mods changes
//     with every change of a bit, so an iterator holding a ref knows when to look again.
//  6. The directory is a shortcut past the inner levels for the blocks (4096-id groups, one
//     level-1 node each) nearest 0, where row ids and page numbers live: t.dir[b] is the ref
//     of block b's level-1 node, shared or not, for every b < len(t.dir). It covers at most
//     dirSlack + 1.5 blocks per level-1 node, and never more than Cap(), so it costs under 1%
//     of the leaves it serves and little for sparse trees; it grows over a level-1 node
//     allocated past it when the bound allows.

import (
	"iter"
	"math/bits"

	"github.com/weftdb/weft/internal/assert"
)

const (
	// MaxID is the largest id a Tree can hold: 64^7 - 1, i.e. 2^42 - 1, seven levels of 64-ary
	// words counting the leaves. Set panics above it; Test, Clear and the queries treat every
	// id above it as clear and absent.
	MaxID uint64 = 1<<idBits - 1

	idBits     = 42           // 6 bits per level: leaf bit, then levels 1..maxHeight
	maxHeight  = idBits/6 - 1 // level of the root when the tree covers every id
	emptyRef   = uint32(0)    // shared, never written: an all-clear subtree
	fullRef    = uint32(1)    // shared, never written: an all-set subtree
	sharedRefs = uint32(2)    // refs below this name shared nodes
	kindSet    = 0            // find looks for a set id; index of any in a node's summary pair
	kindClear  = 1            // find looks for a clear id; index of notFull
	blockBits  = 12           // ids per level-1 node (a block) = 1 << blockBits
	dirSlack   = 64           // blocks the directory may cover beyond 1.5 per level-1 node
)

// level holds the nodes of one level of summaries, each identified by its ref (index).
type level struct {
	// sum holds two words per node: sum[2n] = any(n), sum[2n+1] = notFull(n).
	sum []uint64
	// child holds 64 refs per node into the level below; empty at level 1, whose children
	// are the leaf words Tree.leaf[64n : 64n+64].
	child []uint32
}

// Tree is a set of ids in [0, MaxID], kept as a 64-ary hierarchy of bitmaps: leaf words hold
// one bit per id, and each inner word summarises 64 words below it twice, "some set below"
// and "some clear below", so NextSet and NextClear walk up to the nearest summary with a
// candidate and back down in O(levels). A directory of the level-1 nodes nearest 0 lets Test,
// Set and Clear there touch the leaf word alone. The package documentation draws the levels.
//
// The zero Tree is empty and ready to use. A Tree has no locks: callers serialise access
// (any number of concurrent readers, or one writer).
type Tree struct {
	lv    [maxHeight + 1]level // lv[1..h]; lv[0] is unused
	leaf  []uint64             // 64 words per level-1 node: bit b of word w of node n = id 4096n+64w+b relative to the node
	dir   []uint32             // dir[b] = ref of the level-1 node of block b (ids [4096b, 4096b+4096))
	root  uint32               // ref of the root node at level h
	h     int                  // level of the root; 0 when nothing is allocated
	count uint64               // set ids
	mods  uint64               // bumped by every change, so iterators know to look again
}

// New returns an empty tree; it allocates nothing until the first Set.
func New() *Tree { return &Tree{} }

// digit returns the index of the child holding id i inside its level-l node (l = 0: the bit
// inside its leaf word; l = 1: the leaf word inside its level-1 node).
func digit(i uint64, l int) uint64 { return i >> (6 * l) & 63 }

// Cap returns the number of ids the tree covers without growing: 64^(h+1) for a root at level
// h, 0 before the first Set. Ids at or above it are clear. It grows on Set and never shrinks
// before Reset.
func (t *Tree) Cap() uint64 {
	if t.h == 0 {
		return 0
	}
	return 1 << (6 * (t.h + 1))
}

// Count returns the number of set ids, in O(1).
func (t *Tree) Count() uint64 { return t.count }

// MemBytes returns the bytes of memory held by the tree's arrays (their capacity), for cache
// budgets. A level-1 node (4096 ids) costs 528 bytes, an inner node 272 bytes; whole empty or
// whole full subtrees cost nothing.
func (t *Tree) MemBytes() uint64 {
	n := uint64(cap(t.leaf))*8 + uint64(cap(t.dir))*4
	for l := range t.lv {
		n += uint64(cap(t.lv[l].sum))*8 + uint64(cap(t.lv[l].child))*4
	}
	return n
}

// Test reports whether id i is set. Ids above MaxID are never set.
func (t *Tree) Test(i uint64) bool {
	if b := i >> blockBits; b < uint64(len(t.dir)) {
		return t.leaf[int(t.dir[b])<<6|int(digit(i, 1))]>>(i&63)&1 != 0
	}
	if i >= t.Cap() {
		return false
	}
	ref := t.root
	for l := t.h; l > 1; l-- {
		ref = t.lv[l].child[int(ref)<<6|int(digit(i, l))]
	}
	return t.leaf[int(ref)<<6|int(digit(i, 1))]>>(i&63)&1 != 0
}

// leafNode returns the ref of the level-1 node covering id i < Cap(), shared or not.
func (t *Tree) leafNode(i uint64) uint32 {
	if b := i >> blockBits; b < uint64(len(t.dir)) {
		return t.dir[b]
	}
	ref := t.root
	for l := t.h; l > 1; l-- {
		ref = t.lv[l].child[int(ref)<<6|int(digit(i, l))]
	}
	return ref
}

// Set sets id i. It panics if i > MaxID (a programmer error: ids come from an allocator that
// must stay below the limit). It allocates only when i falls into a region that was empty.
func (t *Tree) Set(i uint64) {
	if t.flipFast(i, true) {
		return
	}
	if i > MaxID {
		panicAboveMax(i) // out of line: Failf's boxed arguments stay off the inlined path
	}
	for i >= t.Cap() {
		t.grow()
	}
	t.mutate(i, true)
}

func panicAboveMax(i uint64) { assert.Failf("bitmaptree: Set(%d) above MaxID %d", i, MaxID) }

// Clear clears id i. Clearing an id that is not set, including any id above MaxID, does
// nothing.
func (t *Tree) Clear(i uint64) {
	if t.flipFast(i, false) || i >= t.Cap() {
		return
	}
	t.mutate(i, false)
}

// flipFast sets or clears id i if that changes no summary above level 1: i lies in a private
// level-1 node in the directory, and the node neither was nor becomes empty or full. It
// reports whether the change is done; if not, nothing has changed.
func (t *Tree) flipFast(i uint64, set bool) bool {
	b := i >> blockBits
	if b >= uint64(len(t.dir)) || t.dir[b] < sharedRefs {
		return false
	}
	ref := int(t.dir[b])
	wi := ref<<6 | int(digit(i, 1))
	old := t.leaf[wi]
	w := old &^ (1 << (i & 63))
	if set {
		w = old | 1<<(i&63)
	}
	if w == old {
		return true
	}
	if (old == 0) != (w == 0) || (old == ^uint64(0)) != (w == ^uint64(0)) {
		s := t.lv[1].sum[2*ref : 2*ref+2 : 2*ref+2]
		bit := uint64(1) << digit(i, 1)
		someSet, someClear := s[0]&^bit, s[1]&^bit
		if w != 0 {
			someSet |= bit
		}
		if w != ^uint64(0) {
			someClear |= bit
		}
		if (someSet == 0) != (s[0] == 0) || (someClear == 0) != (s[1] == 0) {
			return false // the parent's summary changes too
		}
		s[0], s[1] = someSet, someClear
	}
	t.leaf[wi] = w
	t.mods++
	if set {
		t.count++
	} else {
		t.count--
	}
	return true
}

// mutate sets or clears id i < Cap(), copying shared nodes on the way down as needed, then
// repairing the summaries on the way up for as long as a node's emptiness or fullness changed.
func (t *Tree) mutate(i uint64, set bool) {
	noop := emptyRef // a shared subtree that already has the wanted value
	if set {
		noop = fullRef
	}
	if t.root < sharedRefs {
		if t.root == noop {
			return
		}
		t.root = t.allocAt(t.h, t.root, i)
	}
	var path [maxHeight + 1]uint32
	ref := t.root
	for l := t.h; l > 1; l-- {
		path[l] = ref
		ci := int(ref)<<6 | int(digit(i, l))
		c := t.lv[l].child[ci]
		if c < sharedRefs {
			if c == noop {
				return
			}
			c = t.allocAt(l-1, c, i)
			t.lv[l].child[ci] = c
		}
		ref = c
	}
	path[1] = ref
	wi := int(ref)<<6 | int(digit(i, 1))
	old := t.leaf[wi]
	w := old &^ (1 << (i & 63))
	if set {
		w = old | 1<<(i&63)
	}
	if w == old {
		return
	}
	t.leaf[wi] = w
	t.mods++
	if set {
		t.count++
	} else {
		t.count--
	}
	if (old == 0) != (w == 0) || (old == ^uint64(0)) != (w == ^uint64(0)) {
		t.fixUp(&path, i, w != 0, w != ^uint64(0))
	}
}

// SetWord sets every id 64*wi+b for which bit b of w is set: the 64 ids of leaf word wi at
// once, as a loader that knows whole words (a logical page's present mask) wants; Set per bit
// costs 64 times as many walks. It panics if an id it sets is above MaxID.
//
// Its walk down repeats mutate's on purpose: one shared helper measured 8% slower on Set's
// slow path (BenchmarkCompare density=sparse op=Set, 16.4 -> 17.8 ns, same run).
func (t *Tree) SetWord(wi, w uint64) {
	if w == 0 {
		return
	}
	i := wi << 6
	if i > MaxID || wi > MaxID>>6 {
		panicAboveMax(i)
	}
	for i >= t.Cap() {
		t.grow()
	}
	if t.root == fullRef {
		return
	}
	if t.root == emptyRef {
		t.root = t.allocAt(t.h, emptyRef, i)
	}
	var path [maxHeight + 1]uint32
	ref := t.root
	for l := t.h; l > 1; l-- {
		path[l] = ref
		ci := int(ref)<<6 | int(digit(i, l))
		c := t.lv[l].child[ci]
		if c < sharedRefs {
			if c == fullRef {
				return
			}
			c = t.allocAt(l-1, c, i)
			t.lv[l].child[ci] = c
		}
		ref = c
	}
	path[1] = ref
	li := int(ref)<<6 | int(digit(i, 1))
	old := t.leaf[li]
	nw := old | w
	if nw == old {
		return
	}
	t.leaf[li] = nw
	t.mods++
	t.count += uint64(bits.OnesCount64(nw &^ old))
	if old == 0 || nw == ^uint64(0) {
		t.fixUp(&path, i, true, nw != ^uint64(0))
	}
}

// fixUp records that the child holding id i (a leaf word at level 1) now has some set id
// (someSet) and some clear id (someClear), starting at level 1 of path and going up while a
// node's own state changes.
func (t *Tree) fixUp(path *[maxHeight + 1]uint32, i uint64, someSet, someClear bool) {
	for l := 1; l <= t.h; l++ {
		s := t.lv[l].sum[2*int(path[l]) : 2*int(path[l])+2 : 2*int(path[l])+2]
		wasSet, wasClear := s[0] != 0, s[1] != 0
		bit := uint64(1) << digit(i, l)
		s[0], s[1] = s[0]&^bit, s[1]&^bit
		if someSet {
			s[0] |= bit
		}
		if someClear {
			s[1] |= bit
		}
		someSet, someClear = s[0] != 0, s[1] != 0
		if someSet == wasSet && someClear == wasClear {
			return
		}
	}
}

// alloc appends a private copy of the shared node src (emptyRef or fullRef) at level l and
// returns its ref.
func (t *Tree) alloc(l int, src uint32) uint32 {
	lv := &t.lv[l]
	n := len(lv.sum) / 2
	assert.That(n < 1<<32-1, "bitmaptree: out of refs")
	fill := uint64(0)
	if src == fullRef {
		fill = ^uint64(0)
	}
	lv.sum = append(lv.sum, fill, ^fill)
	if l == 1 {
		t.leaf = appendN(t.leaf, fill, 64)
	} else {
		lv.child = appendN(lv.child, src, 64)
	}
	return uint32(n)
}

// allocAt is alloc for the node at level l holding id i: a level-1 node is recorded in the
// directory, which grows over it if the directory's bound allows.
func (t *Tree) allocAt(l int, src uint32, i uint64) uint32 {
	ref := t.alloc(l, src)
	if l != 1 {
		return ref
	}
	b := i >> blockBits
	if b >= uint64(len(t.dir)) {
		nodes := uint64(len(t.lv[1].sum) / 2)
		limit := min(dirSlack+nodes+nodes/2, t.Cap()>>blockBits)
		if b >= limit {
			return ref
		}
		for x := uint64(len(t.dir)); x <= b; x++ { // append amortises the growth
			t.dir = append(t.dir, t.leafNode(x<<blockBits)) // entry b is set below
		}
	}
	t.dir[b] = ref
	return ref
}

func appendN[E any](s []E, v E, n int) []E {
	for range n {
		s = append(s, v)
	}
	return s
}

// grow adds a level on top: the old root becomes child 0 of the new one. An empty root stays
// the shared empty node, so an empty tree grows without allocating nodes.
func (t *Tree) grow() {
	assert.That(t.h < maxHeight, "bitmaptree: grow beyond the maximum height")
	l := t.h + 1
	assert.That(len(t.lv[l].sum) == 0, "bitmaptree: grow onto a level in use")
	t.alloc(l, emptyRef) // the shared nodes
	t.alloc(l, fullRef)
	old := t.root
	t.root = emptyRef
	if t.h > 0 && old != emptyRef {
		t.root = t.alloc(l, emptyRef)
		t.lv[l].child[int(t.root)<<6] = old
		s := t.lv[l].sum[2*int(t.root):]
		if t.lv[t.h].sum[2*int(old)] != 0 {
			s[0] |= 1
		}
		if t.lv[t.h].sum[2*int(old)+1] == 0 {
			s[1] &^= 1
		}
	}
	t.h = l
}

// NextSet returns the first set id >= from, and false if there is none.
func (t *Tree) NextSet(from uint64) (uint64, bool) {
	if from >= t.Cap() {
		return 0, false
	}
	id, _, ok := t.find(from, kindSet)
	return id, ok
}

// NextClear returns the first clear id >= from. Ids at or above Cap() are clear, so it finds
// one unless every id from from to MaxID is set, or from > MaxID.
func (t *Tree) NextClear(from uint64) (uint64, bool) {
	if from >= t.Cap() {
		return from, from <= MaxID
	}
	if id, _, ok := t.find(from, kindClear); ok {
		return id, true
	}
	return t.Cap(), t.Cap() <= MaxID
}

// find returns the first id >= from that is set (kind = kindSet) or clear (kindClear) inside
// the tree, with the ref of the level-1 node holding it. It requires from < Cap(). It walks
// down to the leaf word of from, then up to the nearest summary word with a candidate to the
// right, then down along the lowest candidate: O(h) words, whatever the density.
func (t *Tree) find(from uint64, kind int) (id uint64, node uint32, ok bool) {
	flip := -uint64(kind) // 0 to look for set bits, all ones to look for clear ones
	if b := from >> blockBits; b < uint64(len(t.dir)) {
		// Most answers lie in the word of from or its level-1 node, which the directory
		// reaches without the inner levels.
		ref := t.dir[b]
		if w := (t.leaf[int(ref)<<6|int(digit(from, 1))] ^ flip) >> (from & 63); w != 0 {
			return from + uint64(bits.TrailingZeros64(w)), ref, true
		}
		d := digit(from, 1)
		if s := t.lv[1].sum[2*int(ref)+kind] >> d >> 1; s != 0 {
			c := d + 1 + uint64(bits.TrailingZeros64(s))
			w := t.leaf[int(ref)<<6|int(c)] ^ flip
			return from&^(1<<blockBits-1) | c<<6 | uint64(bits.TrailingZeros64(w)), ref, true
		}
	}
	var path [maxHeight + 1]uint32
	ref := t.root
	for l := t.h; l > 1; l-- {
		path[l] = ref
		ref = t.lv[l].child[int(ref)<<6|int(digit(from, l))]
	}
	path[1] = ref
	if w := (t.leaf[int(ref)<<6|int(digit(from, 1))] ^ flip) >> (from & 63); w != 0 {
		return from + uint64(bits.TrailingZeros64(w)), ref, true
	}
	for l := 1; l <= t.h; l++ {
		d := digit(from, l)
		s := t.lv[l].sum[2*int(path[l])+kind] >> d >> 1 // candidates right of the child of from
		if s == 0 {
			continue
		}
		c := d + 1 + uint64(bits.TrailingZeros64(s))
		id = from>>(6*(l+1))<<(6*(l+1)) | c<<(6*l)
		ref = path[l]
		for ; l > 1; l-- {
			ref = t.lv[l].child[int(ref)<<6|int(c)]
			c = uint64(bits.TrailingZeros64(t.lv[l-1].sum[2*int(ref)+kind]))
			id |= c << (6 * (l - 1))
		}
		w := t.leaf[int(ref)<<6|int(c)] ^ flip
		return id | uint64(bits.TrailingZeros64(w)), ref, true
	}
	return 0, 0, false
}

// Last returns the largest set id, and false if the tree is empty.
func (t *Tree) Last() (uint64, bool) {
	if t.count == 0 {
		return 0, false
	}
	var id uint64
	ref := t.root
	for l := t.h; l >= 1; l-- {
		c := uint64(63 - bits.LeadingZeros64(t.lv[l].sum[2*int(ref)]))
		id |= c << (6 * l)
		if l > 1 {
			ref = t.lv[l].child[int(ref)<<6|int(c)]
		} else {
			w := t.leaf[int(ref)<<6|int(c)]
			id |= uint64(63 - bits.LeadingZeros64(w))
		}
	}
	return id, true
}

// All returns the set ids in increasing order. See Range for changes during iteration.
func (t *Tree) All() iter.Seq[uint64] { return t.Range(0, MaxID+1) }

// Range returns the set ids in [lo, hi) in increasing order. The loop body may change the
// tree (Set, Clear, SetWord, Reset): the iteration then goes on after the id just
// yielded, over the tree as it is now, so it yields exactly the ids that are set when the
// cursor reaches them. Without changes a step costs a few nanoseconds and a gap one NextSet;
// after a change, the next step costs one NextSet.
func (t *Tree) Range(lo, hi uint64) iter.Seq[uint64] {
	// The loop of Words, with one yield per id rather than per word: layering Range on
	// Words would cost a second indirect call per id.
	return func(yield func(uint64) bool) {
	node:
		for lo < hi && lo < t.Cap() {
			id, node, ok := t.find(lo, kindSet)
			if !ok || id >= hi {
				return
			}
			mods := t.mods
			base := id &^ (1<<blockBits - 1)
			mask := ^uint64(0) << (id & 63)
			for wi := digit(id, 1); ; {
				for w := t.leaf[int(node)<<6|int(wi)] & mask; w != 0; w &= w - 1 {
					x := base | wi<<6 | uint64(bits.TrailingZeros64(w))
					if x >= hi || !yield(x) {
						return
					}
					if t.mods != mods {
						lo = x + 1
						continue node
					}
				}
				mask = ^uint64(0)
				s := t.lv[1].sum[2*int(node)] >> wi >> 1
				if s == 0 {
					break
				}
				wi += 1 + uint64(bits.TrailingZeros64(s))
			}
			lo = base + 1<<blockBits
		}
	}
}

// Words returns, in increasing order, every 64-aligned group of ids that holds a set id in
// [lo, hi), as its first id and the bitmap of its set ids in [lo, hi) (bit b = id first+b).
// With row ids, that is each logical page holding rows with its present mask. The loop body
// may change the tree; the iteration then goes on after the group just yielded, over the tree
// as it is now. A step costs a few nanoseconds, and a gap one NextSet.
func (t *Tree) Words(lo, hi uint64) iter.Seq2[uint64, uint64] {
	return func(yield func(uint64, uint64) bool) {
	node:
		for lo < hi && lo < t.Cap() {
			id, node, ok := t.find(lo, kindSet)
			if !ok || id >= hi {
				return
			}
			// Walk this level-1 node's words through its any summary, from the word of id.
			mods := t.mods
			base := id &^ (1<<blockBits - 1)
			for wi := digit(id, 1); ; {
				first := base | wi<<6
				if first >= hi {
					return
				}
				if w := t.leaf[int(node)<<6|int(wi)] & wordMask(first, lo, hi); w != 0 {
					if !yield(first, w) {
						return
					}
					if t.mods != mods {
						lo = first + 64
						continue node
					}
				}
				s := t.lv[1].sum[2*int(node)] >> wi >> 1
				if s == 0 {
					break
				}
				wi += 1 + uint64(bits.TrailingZeros64(s))
			}
			lo = base + 1<<blockBits
		}
	}
}

// wordMask returns the bits of the word of ids [first, first+64) that fall in [lo, hi).
func wordMask(first, lo, hi uint64) uint64 {
	m := ^uint64(0)
	if lo > first {
		m <<= lo - first // lo - first < 64 whenever the word is visited
	}
	if hi-first < 64 {
		m &= 1<<(hi-first) - 1
	}
	return m
}

// Word returns the bitmap of the 64-aligned group of ids holding i: bit b is id i&^63 + b.
// With row ids, that is the present mask of the logical page of row i.
func (t *Tree) Word(i uint64) uint64 {
	if i >= t.Cap() {
		return 0
	}
	return t.leaf[int(t.leafNode(i))<<6|int(digit(i, 1))]
}

// Reset empties the tree and releases its memory.
func (t *Tree) Reset() { *t = Tree{mods: t.mods + 1} }

// Clone returns an independent copy of the tree, sized to fit.
func (t *Tree) Clone() *Tree {
	c := &Tree{root: t.root, h: t.h, count: t.count}
	c.leaf = cloneExact(t.leaf)
	c.dir = cloneExact(t.dir)
	for l := range t.lv {
		c.lv[l].sum = cloneExact(t.lv[l].sum)
		c.lv[l].child = cloneExact(t.lv[l].child)
	}
	return c
}

// cloneExact copies s into a slice whose capacity is its length (nil if empty).
func cloneExact[E any](s []E) []E {
	if len(s) == 0 {
		return nil
	}
	c := make([]E, len(s))
	copy(c, s)
	return c
}
