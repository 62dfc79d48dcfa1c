package bitmaptree

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// treeOf returns a tree holding ids.
func treeOf(ids ...uint64) *Tree {
	t := New()
	for _, i := range ids {
		t.Set(i)
	}
	return t
}

// collect returns the ids of seq.
func collect(seq func(func(uint64) bool)) []uint64 {
	out := []uint64{}
	for x := range seq {
		out = append(out, x)
	}
	return out
}

// usedBytes is MemBytes counting slice lengths instead of capacities.
func (t *Tree) usedBytes() uint64 {
	n := uint64(len(t.leaf))*8 + uint64(len(t.dir))*4
	for l := range t.lv {
		n += uint64(len(t.lv[l].sum))*8 + uint64(len(t.lv[l].child))*4
	}
	return n
}

func TestEmptyTree(t *testing.T) {
	for name, tr := range map[string]*Tree{"zero": {}, "New": New(), "reset": treeOf(1, 1<<40)} {
		t.Run(name, func(t *testing.T) {
			tr.Reset()
			require.Zero(t, tr.Count())
			require.Zero(t, tr.Cap())
			require.Zero(t, tr.MemBytes())
			require.False(t, tr.Test(0))
			require.False(t, tr.Test(MaxID+1))
			_, ok := tr.NextSet(0)
			require.False(t, ok)
			_, ok = tr.Last()
			require.False(t, ok)
			for _, from := range []uint64{0, 77, MaxID} {
				id, ok := tr.NextClear(from)
				require.True(t, ok)
				require.Equal(t, from, id)
			}
			_, ok = tr.NextClear(MaxID + 1)
			require.False(t, ok)
			tr.Clear(5)
			tr.Clear(MaxID + 1)
			require.Zero(t, tr.MemBytes(), "Clear of a clear id allocates nothing")
			require.Empty(t, collect(tr.All()))
			require.NoError(t, tr.verify())
		})
	}
}

func TestSetAboveMaxIDPanics(t *testing.T) {
	tr := New()
	require.NotPanics(t, func() { tr.Set(MaxID) })
	require.PanicsWithValue(t,
		"weft: invariant violated: bitmaptree: Set(4398046511104) above MaxID 4398046511103",
		func() { tr.Set(MaxID + 1) })
	require.Panics(t, func() { tr.Set(^uint64(0)) })
	require.Equal(t, uint64(1), tr.Count())
}

func TestCapGrows(t *testing.T) {
	tr := New()
	for _, c := range []struct{ set, wantCap uint64 }{
		{0, 1 << 12}, {4095, 1 << 12}, {4096, 1 << 18}, {1<<18 - 1, 1 << 18}, {1 << 18, 1 << 24},
		{1 << 30, 1 << 36}, {1<<36 + 1, 1 << 42}, {MaxID, 1 << 42},
	} {
		tr.Set(c.set)
		require.Equal(t, c.wantCap, tr.Cap(), "after Set(%d)", c.set)
		require.NoError(t, tr.verify())
	}
	require.Equal(t, []uint64{0, 4095, 4096, 1<<18 - 1, 1 << 18, 1 << 30, 1<<36 + 1, MaxID}, collect(tr.All()))
}

func TestQueries(t *testing.T) {
	run := func(lo, hi uint64) []uint64 {
		var ids []uint64
		for i := lo; i < hi; i++ {
			ids = append(ids, i)
		}
		return ids
	}
	cases := []struct {
		name  string
		ids   []uint64
		from  uint64
		set   uint64 // NextSet(from); noID if none
		clear uint64 // NextClear(from); noID if none
	}{
		{"same word", []uint64{5, 9}, 6, 9, 6},
		{"at from", []uint64{5, 9}, 5, 5, 6},
		{"next word", []uint64{3, 64 + 7}, 4, 64 + 7, 4},
		{"next level-1 node", []uint64{1, 4096*5 + 3}, 2, 4096*5 + 3, 2},
		{"next level-2 node", []uint64{1, 1<<18*3 + 3}, 2, 1<<18*3 + 3, 2},
		{"far", []uint64{1, 1<<36 + 3}, 2, 1<<36 + 3, 2},
		{"none after", []uint64{1, 100}, 101, noID, 101},
		{"from beyond cap", []uint64{1}, 1 << 20, noID, 1 << 20},
		{"full word", run(0, 64), 0, 0, 64},
		{"full word ends cap", run(4032, 4096), 4032, 4032, 4096},
		{"full level-1 node", run(0, 4096+64+1), 10, 10, 4096 + 64 + 1},
		{"full to cap", run(0, 4096), 17, 17, 4096},
		{"full to MaxID", run(MaxID-200, MaxID+1), MaxID - 100, MaxID - 100, noID},
		{"MaxID clear", run(MaxID-200, MaxID), MaxID - 100, MaxID - 100, MaxID},
		{"from MaxID+1", []uint64{MaxID}, MaxID + 1, noID, noID},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, tr := range []*Tree{treeOf(c.ids...), rebuild(t, treeOf(c.ids...))} {
				id, ok := tr.NextSet(c.from)
				require.Equal(t, c.set != noID, ok, "NextSet ok")
				if ok {
					require.Equal(t, c.set, id, "NextSet")
				}
				id, ok = tr.NextClear(c.from)
				require.Equal(t, c.clear != noID, ok, "NextClear ok")
				if ok {
					require.Equal(t, c.clear, id, "NextClear")
				}
				require.Equal(t, uint64(len(c.ids)), tr.Count())
				last, ok := tr.Last()
				require.True(t, ok)
				require.Equal(t, slices.Max(c.ids), last)
			}
		})
	}
}

const noID = ^uint64(0)

// rebuild returns a tree built from tr's words with SetWord, as the storage node rebuilds its
// trees at Open.
func rebuild(t testing.TB, tr *Tree) *Tree {
	t.Helper()
	n := New()
	for first, w := range tr.Words(0, MaxID+1) {
		n.SetWord(first>>6, w)
	}
	require.NoError(t, n.verify())
	return n
}

func TestRange(t *testing.T) {
	tr := treeOf(0, 1, 63, 64, 4095, 4096, 1<<20, 1<<36, MaxID)
	cases := []struct {
		lo, hi uint64
		want   []uint64
	}{
		{0, 0, []uint64{}},
		{5, 2, []uint64{}},
		{0, 2, []uint64{0, 1}},
		{1, 64, []uint64{1, 63}},
		{63, 4097, []uint64{63, 64, 4095, 4096}},
		{4097, 1 << 36, []uint64{1 << 20}},
		{1 << 36, MaxID, []uint64{1 << 36}},
		{MaxID, MaxID + 1, []uint64{MaxID}},
		{MaxID + 1, noID, []uint64{}},
	}
	for _, c := range cases {
		require.Equal(t, c.want, collect(tr.Range(c.lo, c.hi)), "Range(%d, %d)", c.lo, c.hi)
	}
	// Stopping early.
	var got []uint64
	for x := range tr.All() {
		got = append(got, x)
		if len(got) == 3 {
			break
		}
	}
	require.Equal(t, []uint64{0, 1, 63}, got)
}

func TestWords(t *testing.T) {
	tr := treeOf(0, 1, 63, 64, 130, 4095, 4096, 1<<20+3, 1<<36, MaxID)
	type group struct{ first, mask uint64 }
	words := func(lo, hi uint64) []group {
		out := []group{}
		for first, w := range tr.Words(lo, hi) {
			out = append(out, group{first, w})
		}
		return out
	}
	cases := []struct {
		lo, hi uint64
		want   []group
	}{
		{0, 0, []group{}},
		{0, 1 << 62, []group{{0, 1<<0 | 1<<1 | 1<<63}, {64, 1}, {128, 1 << 2}, {4032, 1 << 63}, {4096, 1},
			{1 << 20, 1 << 3}, {1 << 36, 1}, {MaxID &^ 63, 1 << 63}}},
		{1, 64, []group{{0, 1<<1 | 1<<63}}},
		{1, 63, []group{{0, 1 << 1}}},
		{2, 63, []group{}},
		{64, 131, []group{{64, 1}, {128, 1 << 2}}},
		{65, 130, []group{}},
		{MaxID, MaxID + 1, []group{{MaxID &^ 63, 1 << 63}}},
	}
	for _, c := range cases {
		require.Equal(t, c.want, words(c.lo, c.hi), "Words(%d, %d)", c.lo, c.hi)
	}
	for _, c := range []struct{ i, want uint64 }{{0, 1<<0 | 1<<1 | 1<<63}, {63, 1<<0 | 1<<1 | 1<<63},
		{64, 1}, {200, 0}, {1<<20 + 60, 1 << 3}, {MaxID, 1 << 63}, {MaxID + 1, 0}, {noID, 0}} {
		require.Equal(t, c.want, tr.Word(c.i), "Word(%d)", c.i)
	}
	// Clearing the yielded group and the next one while iterating.
	var firsts []uint64
	for first := range tr.Words(0, 5000) {
		firsts = append(firsts, first)
		tr.Clear(first)
		tr.Clear(128 + 2)
	}
	require.Equal(t, []uint64{0, 64, 4032, 4096}, firsts)
}

func TestRangeWhileModifying(t *testing.T) {
	t.Run("clear behind and ahead", func(t *testing.T) {
		tr := treeOf(1, 2, 3, 70, 5000, 9000)
		var got []uint64
		for x := range tr.All() {
			got = append(got, x)
			tr.Clear(x)
			if x == 2 {
				tr.Clear(70) // ahead: must not be seen, it is read when the cursor gets there
			}
		}
		require.Equal(t, []uint64{1, 2, 3, 5000, 9000}, got)
		require.Zero(t, tr.Count())
	})
	t.Run("set ahead", func(t *testing.T) {
		tr := treeOf(1)
		var got []uint64
		for x := range tr.All() {
			got = append(got, x)
			if x < 1<<20 {
				tr.Set(x * 3) // grows the tree on the way
			}
		}
		require.Equal(t, []uint64{1, 3, 9, 27, 81, 243, 729, 2187, 6561, 19683, 59049, 177147, 531441, 1594323}, got)
	})
	t.Run("reset", func(t *testing.T) {
		tr := treeOf(1, 2, 3)
		var got []uint64
		for x := range tr.All() {
			got = append(got, x)
			tr.Reset()
			tr.Set(2) // the iteration goes on after 1 over the new contents, then after 2
		}
		require.Equal(t, []uint64{1, 2}, got)
	})
}

// TestConcurrentReaders backs the documented contract that readers need no lock among
// themselves (run it with -race).
func TestConcurrentReaders(t *testing.T) {
	tr := New()
	for i := uint64(0); i < 1<<16; i += 7 {
		tr.Set(i)
	}
	tr.Set(1 << 30)
	var wg sync.WaitGroup
	counts := make([]uint64, 4)
	for g := range counts {
		wg.Go(func() {
			for x := range tr.All() {
				if tr.Test(x) {
					counts[g]++
				}
				if y, ok := tr.NextSet(x); !ok || y != x {
					counts[g] = 0
					return
				}
				tr.NextClear(x)
			}
		})
	}
	wg.Wait()
	for _, c := range counts {
		require.Equal(t, tr.Count(), c)
	}
}

func TestClone(t *testing.T) {
	tr := treeOf(1, 4096, 1<<30)
	c := tr.Clone()
	tr.Set(2)
	tr.Clear(4096)
	c.Set(3)
	require.Equal(t, []uint64{1, 2, 1 << 30}, collect(tr.All()))
	require.Equal(t, []uint64{1, 3, 4096, 1 << 30}, collect(c.All()))
	require.NoError(t, tr.verify())
	require.NoError(t, c.verify())
	require.Zero(t, New().Clone().Cap())
}

// TestDenseMemory checks the memory of a densely set id range: the leaf words plus under 6%
// (per level-1 node of 64 leaf words: 2 summary words, a 4-byte child ref in its parent, a
// 4-byte directory entry; and the shared nodes).
func TestDenseMemory(t *testing.T) {
	const n = 1 << 22
	tr := New()
	for i := range uint64(n) {
		tr.Set(i)
	}
	leafBytes := uint64(n / 8)
	require.LessOrEqual(t, tr.usedBytes(), leafBytes*106/100)
	require.LessOrEqual(t, tr.MemBytes(), leafBytes*2, "append slack")
	require.Less(t, tr.Clone().MemBytes(), leafBytes*106/100, "a clone is sized to fit")
}

// TestSparseMemory checks that ids scattered over 2^36 cost a level-1 node each, not the span.
func TestSparseMemory(t *testing.T) {
	tr := New()
	r := rand.New(rand.NewPCG(3, 4))
	for range 1000 {
		tr.Set(r.Uint64N(1 << 36))
	}
	require.Less(t, tr.usedBytes(), uint64(1000*(528+3*272)+8<<10))
}

func TestVerifyCatchesDamage(t *testing.T) {
	for name, damage := range map[string]func(tr *Tree){
		"count":        func(tr *Tree) { tr.count++ },
		"any bit":      func(tr *Tree) { tr.lv[1].sum[2*2] ^= 1 << 1 },
		"notFull bit":  func(tr *Tree) { tr.lv[2].sum[2*2+1] ^= 1 << 2 },
		"shared leaf":  func(tr *Tree) { tr.leaf[3] = 1 },
		"shared child": func(tr *Tree) { tr.lv[2].child[64+3] = emptyRef },
		"two parents":  func(tr *Tree) { tr.lv[2].child[2*64+1] = tr.lv[2].child[2*64+0] },
		"leaf word":    func(tr *Tree) { tr.leaf[2*64] ^= 1 << 9 },
	} {
		tr := treeOf(64, 65, 4096*1+5)
		require.NoError(t, tr.verify())
		damage(tr)
		require.Error(t, tr.verify(), name)
	}
}
