package storenode

import (
	"iter"
	"math/bits"
	"sync/atomic"

	"github.com/weftdb/weft/internal/assert"
)

// pageMap is a table's page map in memory: logical page -> mapEntry, a sparse radix tree of
// fanout 64 whose nodes hold only the children (or, in a leaf, the entries) that exist, found
// by a 64-bit mask and its popcount. Memory is proportional to the entries that exist, not to
// the highest page: one page at the page limit costs five small nodes. A zero mapEntry is
// "no entry" and is never stored.
//
// Versions. A published map is immutable: readers (under Engine.mu or table.io, or holding a
// meta snapshot) read it with no lock of its own. A checkpoint derives the next version with
// edit, which shares every node; set then copies a node the first time the new version changes
// it (path copying) and changes its own copies in place, so a checkpoint that writes W pages
// copies at most the W paths, never the whole map. seal ends the editing: a sealed map is
// never changed again (set on it panics).
//
// A nil *pageMap is the empty map.
type pageMap struct {
	root   *pmNode
	height uint8  // root covers pages [0, 64^(height+1)); 0: the root is a leaf
	gen    uint64 // the version's editing generation; 0 once sealed
}

// pmNode is one node: a leaf (entries) at level 0, else an inner node (kids).
type pmNode struct {
	gen    uint64     // generation that created it: only that version may change it in place
	mask   uint64     // bit i: slot i holds a kid (inner) or an entry (leaf)
	kids   []*pmNode  // inner: popcount(mask) kids in slot order
	ents   []mapEntry // leaf: popcount(mask) entries in slot order
	count  int        // entries in the subtree
	leaves int        // leaves in the subtree (the meta file's leaf records: offsets)
}

// pmHeightMax is the height of a map that reaches tablePagesMax (2^30 = 64^5 pages).
const pmHeightMax = 4

var pmGens atomic.Uint64

// get returns page's entry (zero when none). Any goroutine may call it on a sealed map.
func (m *pageMap) get(page uint64) mapEntry {
	if m == nil || m.root == nil || page>>(6*(uint(m.height)+1)) != 0 {
		return mapEntry{}
	}
	n := m.root
	for level := int(m.height); ; level-- {
		slot := (page >> (6 * uint(level))) & 63
		if n.mask&(1<<slot) == 0 {
			return mapEntry{}
		}
		i := bits.OnesCount64(n.mask & (1<<slot - 1))
		if level == 0 {
			return n.ents[i]
		}
		n = n.kids[i]
	}
}

// count returns the number of entries.
func (m *pageMap) count() int {
	if m == nil || m.root == nil {
		return 0
	}
	return m.root.count
}

// leafCount returns the number of leaves (runs of 64 pages holding at least one entry).
func (m *pageMap) leafCount() int {
	if m == nil || m.root == nil {
		return 0
	}
	return m.root.leaves
}

// edit returns a new editable version of m that shares all of m's nodes; m is unchanged.
func (m *pageMap) edit() *pageMap {
	c := &pageMap{gen: pmGens.Add(1)}
	if m != nil {
		c.root, c.height = m.root, m.height
	}
	return c
}

// seal ends m's editing and returns m.
func (m *pageMap) seal() *pageMap {
	m.gen = 0
	return m
}

// set puts ent at page (a zero ent removes the entry). m must be an editable version.
func (m *pageMap) set(page uint64, ent mapEntry) {
	assert.That(m.gen != 0, "storenode: set on a sealed page map")
	assert.That(page < tablePagesMax, "storenode: page map: page beyond the table limit")
	if ent == (mapEntry{}) && m.get(page) == (mapEntry{}) {
		return
	}
	for page>>(6*(uint(m.height)+1)) != 0 {
		if m.root != nil {
			m.root = &pmNode{gen: m.gen, mask: 1, kids: []*pmNode{m.root}, count: m.root.count, leaves: m.root.leaves}
		}
		m.height++
	}
	assert.That(m.height <= pmHeightMax, "storenode: page map taller than the table limit needs")
	m.root = m.setIn(m.root, int(m.height), page, ent)
}

// own returns n itself when this version created it, else a copy it may change.
func (m *pageMap) own(n *pmNode) *pmNode {
	if n.gen == m.gen {
		return n
	}
	c := &pmNode{gen: m.gen, mask: n.mask, count: n.count, leaves: n.leaves}
	if n.kids != nil {
		c.kids = append(make([]*pmNode, 0, len(n.kids)+1), n.kids...)
	}
	if n.ents != nil {
		c.ents = append(make([]mapEntry, 0, len(n.ents)+1), n.ents...)
	}
	return c
}

// setIn sets page's entry in the subtree n at level and returns the subtree's new root (nil
// when it became empty).
func (m *pageMap) setIn(n *pmNode, level int, page uint64, ent mapEntry) *pmNode {
	slot := (page >> (6 * uint(level))) & 63
	if n == nil {
		if ent == (mapEntry{}) {
			return nil
		}
		n = &pmNode{gen: m.gen}
	} else {
		n = m.own(n)
	}
	i := bits.OnesCount64(n.mask & (1<<slot - 1))
	has := n.mask&(1<<slot) != 0
	if level == 0 {
		switch {
		case ent == (mapEntry{}) && has:
			n.ents = append(n.ents[:i], n.ents[i+1:]...)
			n.mask &^= 1 << slot
			n.count--
		case ent == (mapEntry{}):
		case has:
			n.ents[i] = ent
		default:
			n.ents = append(n.ents, mapEntry{})
			copy(n.ents[i+1:], n.ents[i:])
			n.ents[i] = ent
			n.mask |= 1 << slot
			n.count++
		}
		n.leaves = 0
		if n.mask != 0 {
			n.leaves = 1
		}
	} else {
		var kid *pmNode
		if has {
			kid = n.kids[i]
			n.count -= kid.count
			n.leaves -= kid.leaves
		}
		kid = m.setIn(kid, level-1, page, ent)
		switch {
		case kid == nil && has:
			n.kids = append(n.kids[:i], n.kids[i+1:]...)
			n.mask &^= 1 << slot
		case kid == nil:
		case has:
			n.kids[i] = kid
		default:
			n.kids = append(n.kids, nil)
			copy(n.kids[i+1:], n.kids[i:])
			n.kids[i] = kid
			n.mask |= 1 << slot
		}
		if kid != nil {
			n.count += kid.count
			n.leaves += kid.leaves
		}
	}
	if n.mask == 0 {
		return nil
	}
	return n
}

// all yields every entry in ascending page order.
func (m *pageMap) all() iter.Seq2[uint64, mapEntry] {
	return m.each
}

// each calls fn for every entry in ascending page order until fn returns false.
func (m *pageMap) each(fn func(page uint64, ent mapEntry) bool) {
	m.eachLeaf(func(leaf uint64, mask uint64, ents []mapEntry) bool {
		for k := range ents {
			slot := bits.TrailingZeros64(mask)
			mask &= mask - 1
			if !fn(leaf*64+uint64(slot), ents[k]) {
				return false
			}
		}
		return true
	})
}

// eachLeaf calls fn for every leaf in ascending order, with its index (first page / 64), its
// mask and its entries (valid while the map is; not to be changed), until fn returns false.
func (m *pageMap) eachLeaf(fn func(leaf, mask uint64, ents []mapEntry) bool) {
	if m == nil || m.root == nil {
		return
	}
	pmEachLeaf(m.root, int(m.height), 0, fn)
}

func pmEachLeaf(n *pmNode, level int, base uint64, fn func(leaf, mask uint64, ents []mapEntry) bool) bool {
	if level == 0 {
		return fn(base, n.mask, n.ents)
	}
	mask := n.mask
	for _, kid := range n.kids {
		slot := uint64(bits.TrailingZeros64(mask))
		mask &= mask - 1
		if !pmEachLeaf(kid, level-1, base<<6|slot, fn) {
			return false
		}
	}
	return true
}

// rank returns how many leaves lie wholly before page's leaf and how many entries before
// page: what the meta file's encoding puts before page's entry.
func (m *pageMap) rank(page uint64) (leaves, entries int) {
	if m == nil || m.root == nil {
		return 0, 0
	}
	if page>>(6*(uint(m.height)+1)) != 0 {
		return m.root.leaves, m.root.count
	}
	n := m.root
	for level := int(m.height); n != nil; level-- {
		slot := (page >> (6 * uint(level))) & 63
		i := bits.OnesCount64(n.mask & (1<<slot - 1))
		if level == 0 {
			return leaves, entries + i
		}
		for _, kid := range n.kids[:i] {
			leaves += kid.leaves
			entries += kid.count
		}
		if n.mask&(1<<slot) == 0 {
			return leaves, entries
		}
		n = n.kids[i]
	}
	return leaves, entries
}

// memBytes estimates the map's memory: what the tests bound.
func (m *pageMap) memBytes() int {
	if m == nil || m.root == nil {
		return 0
	}
	return pmMemBytes(m.root)
}

func pmMemBytes(n *pmNode) int {
	size := 96 + cap(n.kids)*8 + cap(n.ents)*metaEntryBytes
	for _, kid := range n.kids {
		size += pmMemBytes(kid)
	}
	return size
}
