package bitmaptree

import (
	"fmt"
	"math/bits"
)

// verify checks every invariant listed at the top of tree.go by walking every node: O(memory).
// Tests call it after every batch of operations; invariant builds (-race or the
// weft_invariants tag) also run it after every load.
func (t *Tree) verify() error {
	if t.h < 0 || t.h > maxHeight {
		return fmt.Errorf("height %d", t.h)
	}
	if t.h == 0 {
		if t.count != 0 || t.root != 0 || t.MemBytes() != 0 || t.dir != nil {
			return fmt.Errorf("unallocated tree has count %d root %d memory %d", t.count, t.root, t.MemBytes())
		}
		return nil
	}
	for l := 1; l <= maxHeight; l++ {
		lv := &t.lv[l]
		if l > t.h {
			if len(lv.sum) != 0 || len(lv.child) != 0 {
				return fmt.Errorf("level %d above root %d holds nodes", l, t.h)
			}
			continue
		}
		nodes := len(lv.sum) / 2
		if len(lv.sum)%2 != 0 || nodes < 2 {
			return fmt.Errorf("level %d: %d summary words", l, len(lv.sum))
		}
		if lv.sum[0] != 0 || lv.sum[1] != ^uint64(0) || lv.sum[2] != ^uint64(0) || lv.sum[3] != 0 {
			return fmt.Errorf("level %d: shared summaries %x", l, lv.sum[:4])
		}
		if l == 1 {
			if len(lv.child) != 0 || len(t.leaf) != 64*nodes {
				return fmt.Errorf("level 1: %d nodes, %d leaf words, %d children", nodes, len(t.leaf), len(lv.child))
			}
			for w := range 64 {
				if t.leaf[w] != 0 || t.leaf[64+w] != ^uint64(0) {
					return fmt.Errorf("shared leaf words written at %d", w)
				}
			}
			continue
		}
		if len(lv.child) != 64*nodes {
			return fmt.Errorf("level %d: %d nodes, %d children", l, nodes, len(lv.child))
		}
		for c := range 64 {
			if lv.child[c] != emptyRef || lv.child[64+c] != fullRef {
				return fmt.Errorf("level %d: shared children written at %d", l, c)
			}
		}
	}
	nodes := uint64(len(t.lv[1].sum) / 2)
	if n := uint64(len(t.dir)); n > min(dirSlack+nodes+nodes/2, t.Cap()>>blockBits) {
		return fmt.Errorf("directory of %d blocks for %d level-1 nodes and capacity %d", n, nodes, t.Cap())
	}
	dir := t.dir
	t.dir = nil // so leafNode walks the levels
	for b, ref := range dir {
		if want := t.leafNode(uint64(b) << blockBits); ref != want {
			t.dir = dir
			return fmt.Errorf("directory says block %d is node %d, the levels say %d", b, ref, want)
		}
	}
	t.dir = dir
	seen := make([][]bool, t.h+1)
	for l := 1; l <= t.h; l++ {
		seen[l] = make([]bool, len(t.lv[l].sum)/2)
	}
	count, _, _, err := t.verifyNode(t.h, t.root, seen)
	if err != nil {
		return err
	}
	if count != t.count {
		return fmt.Errorf("count %d, leaves hold %d", t.count, count)
	}
	for l := 1; l <= t.h; l++ {
		for n, ok := range seen[l] {
			if !ok && n >= int(sharedRefs) {
				return fmt.Errorf("level %d node %d unreachable", l, n)
			}
		}
	}
	return nil
}

// verifyNode checks the subtree of node ref at level l and returns its set ids and whether
// it has some set and some clear id.
func (t *Tree) verifyNode(l int, ref uint32, seen [][]bool) (count uint64, someSet, someClear bool, err error) {
	if int(ref) >= len(seen[l]) {
		return 0, false, false, fmt.Errorf("level %d: ref %d out of %d", l, ref, len(seen[l]))
	}
	span := uint64(1) << (6 * (l + 1))
	switch ref {
	case emptyRef:
		return 0, false, true, nil
	case fullRef:
		return span, true, false, nil
	}
	if seen[l][ref] {
		return 0, false, false, fmt.Errorf("level %d: node %d has two parents", l, ref)
	}
	seen[l][ref] = true
	var any, notFull uint64
	for c := range 64 {
		var n uint64
		var s, cl bool
		if l == 1 {
			w := t.leaf[int(ref)<<6|c]
			n, s, cl = uint64(bits.OnesCount64(w)), w != 0, w != ^uint64(0)
		} else if n, s, cl, err = t.verifyNode(l-1, t.lv[l].child[int(ref)<<6|c], seen); err != nil {
			return 0, false, false, err
		}
		count += n
		if s {
			any |= 1 << c
		}
		if cl {
			notFull |= 1 << c
		}
	}
	if got := t.lv[l].sum[2*int(ref) : 2*int(ref)+2]; got[0] != any || got[1] != notFull {
		return 0, false, false, fmt.Errorf("level %d node %d: summaries %x/%x, children say %x/%x",
			l, ref, got[0], got[1], any, notFull)
	}
	return count, any != 0, notFull != 0, nil
}
