package bitmaptree

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/corrupt"
)

// sharedBytesMax bounds the nodes any tree holds regardless of input: the shared nodes of
// every level and two paths of private ones.
const sharedBytesMax = 8 << 10

// FuzzUnmarshal feeds arbitrary bytes to Unmarshal, as they are and with the body length and
// CRC fixed up (so mutations reach the body parser instead of dying at the checksum). Every
// input must be rejected with a corruption error or decode to a valid tree that re-encodes to
// an equal tree, using node memory in proportion to the input.
func FuzzUnmarshal(f *testing.F) {
	seeds := []*Tree{New(), treeOf(0), treeOf(MaxID), treeOf(1, 3, 64, 4095, 4096, 1<<18, 1<<36)}
	dense := New()
	for i := range uint64(3 << 12) {
		if i%97 != 5 {
			dense.Set(i)
		}
	}
	full := New()
	for i := range uint64(1<<18 + 200) {
		full.Set(i)
	}
	seeds = append(seeds, dense, full)
	for _, tr := range seeds {
		b, err := tr.MarshalBinary()
		require.NoError(f, err)
		f.Add(b)
	}
	f.Add(encodeRaw(7, uint64(len(goldenIDs)), goldenBody))
	f.Add(encodeRaw(maxWords, MaxID+1, runHeader(maxWords, runOnes)))
	f.Add(encodeRaw(maxWords, 1, cat(runHeader(maxWords, runWords), le.AppendUint64(nil, 1))))
	f.Add([]byte{})
	f.Add([]byte("WFBT"))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkDecode(t, data)
		if len(data) >= headerSize {
			fixed := append([]byte(nil), data...)
			le.PutUint64(fixed[offBodyLen:], uint64(len(fixed)-headerSize))
			checkDecode(t, refix(fixed))
		}
	})
}

func checkDecode(t *testing.T, data []byte) {
	tr, err := Unmarshal(data)
	if err != nil {
		require.ErrorIs(t, err, corrupt.ErrCorruption)
		require.Nil(t, tr)
		return
	}
	if err := tr.verify(); err != nil {
		t.Fatal(err)
	}
	if n, limit := tr.usedBytes(), uint64(maxNodeBytesPerInputByte*len(data)+sharedBytesMax); n > limit {
		t.Fatalf("%d input bytes hold %d bytes of nodes, more than %d", len(data), n, limit)
	}
	b, err := tr.MarshalBinary()
	require.NoError(t, err)
	again, err := Unmarshal(b)
	require.NoError(t, err)
	requireEqualTrees(t, tr, again)
}

// requireEqualTrees compares two trees run by run, so it is fast for any tree a short input
// can describe, including ones holding 2^42 ids.
func requireEqualTrees(t *testing.T, a, b *Tree) {
	t.Helper()
	if a.Count() != b.Count() {
		t.Fatalf("Count %d and %d", a.Count(), b.Count())
	}
	for x := uint64(0); ; {
		s, ok := a.NextSet(x)
		s2, ok2 := b.NextSet(x)
		if ok != ok2 || s != s2 {
			t.Fatalf("NextSet(%d): %d %v and %d %v", x, s, ok, s2, ok2)
		}
		if !ok {
			return
		}
		c, ok := a.NextClear(s)
		c2, ok2 := b.NextClear(s)
		if ok != ok2 || c != c2 {
			t.Fatalf("NextClear(%d): %d %v and %d %v", s, c, ok, c2, ok2)
		}
		if !ok {
			return
		}
		x = c
	}
}
