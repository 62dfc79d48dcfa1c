package bitmaptree

// The serialised form lists the leaf words of ids [0, 64*words) as a sequence of runs; the
// summaries are rebuilt on load, never stored. doc.go draws the layout. The encoder's choice
// of runs is not part of the format: the decoder accepts any sequence of valid runs.

import (
	"encoding/binary"
	"math/bits"

	"github.com/weftdb/weft/internal/assert"
	"github.com/weftdb/weft/internal/checksum"
	"github.com/weftdb/weft/internal/corrupt"
)

// Part of the format; do not change.
const (
	formatMagic   = 0x54424657 // "WFBT" in little-endian byte order
	formatVersion = 1

	offMagic   = 0  // uint32 formatMagic
	offVersion = 4  // uint16 formatVersion
	offFlags   = 6  // uint16, must be 0
	offBodyLen = 8  // uint64 bytes after the header; the input is exactly header + body
	offWords   = 16 // uint64 leaf words covered: ids [0, 64*words); <= maxWords
	offCount   = 24 // uint64 set ids; must equal the bits of the body
	offCRC     = 32 // uint32 CRC32C of bytes [0, offCRC) followed by the body
	headerSize = 36

	// A run starts with uvarint(n<<runKindBits | kind): n >= 1 words of one kind.
	runKindBits  = 3
	runZero      = 0 // n all-clear words; nothing follows
	runOnes      = 1 // n all-set words; nothing follows
	runWords     = 2 // n words follow, 8 bytes each, little-endian
	runSetBits   = 3 // uvarint k >= 1, then k uvarint positions: the set bits among the n*64, all others clear
	runClearBits = 4 // same, listing the clear bits; all others set
	// A position list's first uvarint is the position of the first listed bit counted from the
	// run's first bit; each later one is the number of unlisted bits between the previous
	// listed bit and this one, so positions strictly increase by construction.

	maxWords = (MaxID + 1) / 64 // words covering every id
)

var le = binary.LittleEndian

// AppendBinary appends the serialised tree to b and returns the extended slice; the error is
// always nil (the signature is encoding.BinaryAppender's). The encoding depends only on the set
// of ids, not on the tree's history, and costs O(materialised nodes + runs * height): a tree
// of 30M ids at 1% or at 99% density takes about 0.4 MB, an all-set or all-clear stretch of
// any length a few bytes.
func (t *Tree) AppendBinary(b []byte) ([]byte, error) {
	start := len(b)
	var words uint64
	if last, ok := t.Last(); ok {
		words = last>>6 + 1
	}
	b = append(b, make([]byte, headerSize)...)
	for pos := uint64(0); pos < words; {
		node := t.leafNode(pos << 6)
		switch w := t.leaf[int(node)<<6|int(pos&63)]; w {
		case 0:
			id, _, ok := t.find(pos<<6, kindSet)
			assert.That(ok && id>>6 > pos && id>>6 < words, "bitmaptree: zero run ends outside the tree")
			b = binary.AppendUvarint(b, (id>>6-pos)<<runKindBits|runZero)
			pos = id >> 6
		case ^uint64(0):
			end := words
			if id, _, ok := t.find(pos<<6, kindClear); ok && id>>6 < end {
				end = id >> 6
			}
			b = binary.AppendUvarint(b, (end-pos)<<runKindBits|runOnes)
			pos = end
		default:
			end := min(pos|63+1, words) // the rest of this level-1 node
			first := int(node)<<6 | int(pos&63)
			b = appendChunk(b, t.leaf[first:first+int(end-pos)])
			pos = end
		}
	}
	h := b[start : start+headerSize]
	le.PutUint32(h[offMagic:], formatMagic)
	le.PutUint16(h[offVersion:], formatVersion)
	le.PutUint16(h[offFlags:], 0)
	le.PutUint64(h[offBodyLen:], uint64(len(b)-start-headerSize))
	le.PutUint64(h[offWords:], words)
	le.PutUint64(h[offCount:], t.count)
	le.PutUint32(h[offCRC:], checksum.Update(checksum.Of(h[:offCRC]), b[start+headerSize:]))
	return b, nil
}

// MarshalBinary returns the serialised tree (see AppendBinary); the error is always nil.
func (t *Tree) MarshalBinary() ([]byte, error) { return t.AppendBinary(nil) }

// appendChunk appends ws (words inside one level-1 node) as the cheapest of a literal run and
// the two position lists. A position costs at least a byte, so a list is only considered when
// it has fewer than 8 entries per word.
func appendChunk(b []byte, ws []uint64) []byte {
	n := uint64(len(ws))
	kind, cost := uint64(runWords), 8*n
	for _, k := range [...]uint64{runSetBits, runClearBits} {
		if c, ok := positionsCost(ws, k == runClearBits, cost); ok {
			kind, cost = k, c
		}
	}
	b = binary.AppendUvarint(b, n<<runKindBits|kind)
	if kind == runWords {
		for _, w := range ws {
			b = le.AppendUint64(b, w)
		}
		return b
	}
	flip := uint64(0)
	if kind == runClearBits {
		flip = ^uint64(0)
	}
	var k uint64
	for _, w := range ws {
		k += uint64(bits.OnesCount64(w ^ flip))
	}
	b = binary.AppendUvarint(b, k)
	next := uint64(0) // first position the next entry may name
	for wi, w := range ws {
		for w ^= flip; w != 0; w &= w - 1 {
			p := uint64(wi)<<6 | uint64(bits.TrailingZeros64(w))
			b = binary.AppendUvarint(b, p-next)
			next = p + 1
		}
	}
	return b
}

// positionsCost returns the bytes of the position list of the set bits of ws (or of the clear
// bits if clear), and false if that is not below limit or the list would be empty.
func positionsCost(ws []uint64, clear bool, limit uint64) (uint64, bool) {
	flip := uint64(0)
	if clear {
		flip = ^uint64(0)
	}
	var k uint64
	for _, w := range ws {
		k += uint64(bits.OnesCount64(w ^ flip))
	}
	cost := uint64(uvarintLen(k))
	if k == 0 || k+cost >= limit {
		return 0, false
	}
	next := uint64(0)
	for wi, w := range ws {
		for w ^= flip; w != 0; w &= w - 1 {
			p := uint64(wi)<<6 | uint64(bits.TrailingZeros64(w))
			cost += uint64(uvarintLen(p - next))
			next = p + 1
		}
	}
	return cost, cost < limit
}

func uvarintLen(v uint64) int { return (bits.Len64(v|1) + 6) / 7 }

// Unmarshal decodes a tree serialised by AppendBinary. It rejects every malformed input with
// an error wrapping corrupt.ErrCorruption and one of ErrChecksum, ErrVersion or ErrFormat;
// it never panics on bad input. It checks the length and the checksum before it allocates
// any node, and allocates only nodes that the body's runs reach: at most about 300 bytes per
// input byte (a level-1 node and its inner nodes for a position or word that lands alone in a
// new region), which is also what a tree holding such scattered ids costs when built by Set.
// All-set and all-clear runs cost no memory whatever their length.
func Unmarshal(data []byte) (*Tree, error) {
	t := &Tree{}
	if err := t.load(data); err != nil {
		return nil, err
	}
	if assert.Invariants {
		err := t.verify()
		if err != nil {
			assert.Failf("bitmaptree: loaded tree broken: %v", err)
		}
	}
	return t, nil
}

// UnmarshalBinary replaces the tree's contents with the decoded data (see Unmarshal). On error
// the tree is left unchanged.
func (t *Tree) UnmarshalBinary(data []byte) error {
	n, err := Unmarshal(data)
	if err != nil {
		return err
	}
	n.mods = t.mods + 1
	*t = *n
	return nil
}

func formatError(format string, args ...any) error {
	return corrupt.Errorf("bitmaptree: decode: "+format+": %w", append(args, ErrFormat)...)
}

// load decodes data into the empty tree t.
func (t *Tree) load(data []byte) error {
	if len(data) < headerSize {
		return formatError("%d bytes, the header alone takes %d", len(data), headerSize)
	}
	if m := le.Uint32(data[offMagic:]); m != formatMagic {
		return formatError("magic %#08x, want %#08x", m, formatMagic)
	}
	if v := le.Uint16(data[offVersion:]); v != formatVersion {
		return corrupt.Errorf("bitmaptree: decode: version %d, this code reads %d: %w", v, formatVersion, ErrVersion)
	}
	if f := le.Uint16(data[offFlags:]); f != 0 {
		return formatError("flags %#04x, want 0", f)
	}
	body := data[headerSize:]
	if n := le.Uint64(data[offBodyLen:]); n != uint64(len(body)) {
		return formatError("body length %d, but %d bytes follow the header", n, len(body))
	}
	if sum, want := checksum.Update(checksum.Of(data[:offCRC]), body), le.Uint32(data[offCRC:]); sum != want {
		return corrupt.Errorf("bitmaptree: decode: CRC32C %#08x, header says %#08x: %w", sum, want, ErrChecksum)
	}
	words, count := le.Uint64(data[offWords:]), le.Uint64(data[offCount:])
	if words > maxWords {
		return formatError("%d words, at most %d", words, maxWords)
	}
	if count > words*64 {
		return formatError("count %d does not fit %d words", count, words)
	}
	for t.Cap() < words*64 {
		t.grow()
	}
	for pos := uint64(0); pos < words; {
		v, n := binary.Uvarint(body)
		if n <= 0 {
			return formatError("bad run header at body offset %d", len(data)-headerSize-len(body))
		}
		body = body[n:]
		kind, nw := v&(1<<runKindBits-1), v>>runKindBits
		if nw == 0 || nw > words-pos {
			return formatError("run of %d words at word %d of %d", nw, pos, words)
		}
		switch kind {
		case runZero:
		case runOnes:
			t.fillOnes(pos, pos+nw)
		case runWords:
			if nw > uint64(len(body))/8 {
				return formatError("run of %d literal words, %d bytes left", nw, len(body))
			}
			for j := range nw {
				if w := le.Uint64(body[8*j:]); w != 0 {
					t.putWord(pos+j, w)
				}
			}
			body = body[8*nw:]
		case runSetBits, runClearBits:
			var err error
			if body, err = t.loadPositions(body, pos, nw, kind == runClearBits); err != nil {
				return err
			}
		default:
			return formatError("unknown run kind %d at word %d", kind, pos)
		}
		pos += nw
	}
	if len(body) != 0 {
		return formatError("%d trailing bytes after %d words", len(body), words)
	}
	if t.count != count {
		return formatError("header count %d, body holds %d", count, t.count)
	}
	return nil
}

// loadPositions decodes a position list for the nw words from word pos and returns the rest
// of the body. With clear set, the listed bits are the clear ones.
func (t *Tree) loadPositions(body []byte, pos, nw uint64, clear bool) ([]byte, error) {
	k, n := binary.Uvarint(body)
	if n <= 0 {
		return nil, formatError("bad position count at word %d", pos)
	}
	body = body[n:]
	if k == 0 || k > nw*64 || k > uint64(len(body)) {
		return nil, formatError("%d positions in %d words with %d bytes left", k, nw, len(body))
	}
	flip := uint64(0)
	if clear {
		flip = ^uint64(0)
	}
	limit := nw * 64
	next := uint64(0)                // first position the next entry may name
	cur, acc := uint64(0), uint64(0) // the word being gathered (run-relative) and its listed bits
	filled := uint64(0)              // words [0, filled) of the run are written
	flush := func() {
		if clear && filled < cur {
			t.fillOnes(pos+filled, pos+cur)
		}
		if w := acc ^ flip; w != 0 {
			t.putWord(pos+cur, w)
		}
		filled, acc = cur+1, 0
	}
	for range k {
		g, n := binary.Uvarint(body)
		if n <= 0 {
			return nil, formatError("bad position at word %d", pos)
		}
		body = body[n:]
		if g >= limit-next {
			return nil, formatError("position %d+%d beyond %d bits of the run at word %d", next, g, limit, pos)
		}
		p := next + g
		next = p + 1
		if acc != 0 && p>>6 != cur {
			flush()
		}
		cur = p >> 6
		acc |= 1 << (p & 63)
	}
	flush() // k >= 1, so acc holds the last word
	if clear && filled < nw {
		t.fillOnes(pos+filled, pos+nw)
	}
	return body, nil
}

// putWord stores w (not 0) into leaf word wi, which must be clear and not inside a subtree a
// run has already filled: the loader writes words in increasing order, once each.
func (t *Tree) putWord(wi, w uint64) {
	i := wi << 6
	if t.root == emptyRef {
		t.root = t.allocAt(t.h, emptyRef, i)
	}
	var path [maxHeight + 1]uint32
	ref := t.root
	for l := t.h; l > 1; l-- {
		path[l] = ref
		ci := int(ref)<<6 | int(digit(i, l))
		c := t.lv[l].child[ci]
		if c == emptyRef {
			c = t.allocAt(l-1, emptyRef, i)
			t.lv[l].child[ci] = c
		}
		ref = c
	}
	assert.That(ref >= sharedRefs, "bitmaptree: load writes a word into a shared node")
	path[1] = ref
	li := int(ref)<<6 | int(digit(i, 1))
	assert.That(t.leaf[li] == 0, "bitmaptree: load writes a word twice")
	t.leaf[li] = w
	t.count += uint64(bits.OnesCount64(w))
	t.fixUp(&path, i, true, w != ^uint64(0))
}

// fillOnes sets every id of words [lo, hi), which must all be clear. A subtree the range
// covers whole becomes a ref to the shared full node, so a run of any length costs at most
// two paths of nodes.
func (t *Tree) fillOnes(lo, hi uint64) {
	if lo == 0 && hi<<6 == t.Cap() && t.root == emptyRef {
		t.root = fullRef
		t.count += t.Cap()
		assert.That(len(t.dir) == 0, "bitmaptree: fill over the directory")
		return
	}
	if t.root == emptyRef {
		t.root = t.allocAt(t.h, emptyRef, lo<<6)
	}
	assert.That(t.root >= sharedRefs, "bitmaptree: fill below a shared root")
	t.fillNode(t.h, t.root, 0, lo<<6, hi<<6)
}

// fillNode sets ids [lo, hi) inside node ref at level l, which covers ids from base, and
// returns whether the node now has some set and some clear id.
func (t *Tree) fillNode(l int, ref uint32, base, lo, hi uint64) (someSet, someClear bool) {
	span := uint64(1) << (6 * l) // ids per child
	for c := (lo - base) / span; c < 64 && base+c*span < hi; c++ {
		cLo := base + c*span
		ci := int(ref)<<6 | int(c)
		childClear := false
		switch {
		case l == 1:
			assert.That(t.leaf[ci] == 0, "bitmaptree: fill over a written word")
			t.leaf[ci] = ^uint64(0)
			t.count += 64
		case lo <= cLo && cLo+span <= hi:
			assert.That(t.lv[l].child[ci] == emptyRef, "bitmaptree: fill over a written subtree")
			t.lv[l].child[ci] = fullRef
			t.count += span
			// The directory stops at the last level-1 node allocated, which lies before this
			// fresh subtree; it learns of the full node when it grows over it.
			assert.That(cLo>>blockBits >= uint64(len(t.dir)), "bitmaptree: fill under the directory")
		default:
			child := t.lv[l].child[ci]
			if child == emptyRef {
				child = t.allocAt(l-1, emptyRef, cLo)
				t.lv[l].child[ci] = child
			}
			assert.That(child >= sharedRefs, "bitmaptree: fill inside a full subtree")
			_, childClear = t.fillNode(l-1, child, cLo, max(lo, cLo), min(hi, cLo+span))
		}
		s := t.lv[l].sum[2*int(ref) : 2*int(ref)+2]
		s[0] |= 1 << c
		if !childClear {
			s[1] &^= 1 << c
		}
	}
	s := t.lv[l].sum[2*int(ref) : 2*int(ref)+2]
	return s[0] != 0, s[1] != 0
}
