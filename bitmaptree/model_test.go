package bitmaptree

// A model-based test: random operations are applied to a Tree and to model, a sorted slice
// of ids whose every query is a binary search or a short scan, and every answer is compared.
// The same operation executor serves the seeded random test, the rapid state machine and
// FuzzOps.

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/internal/testseed"
	"pgregory.net/rapid"
)

// model is a trivially correct set of ids: sorted, distinct.
type model struct{ ids []uint64 }

func (m *model) set(i uint64) {
	if j, ok := slices.BinarySearch(m.ids, i); !ok {
		m.ids = slices.Insert(m.ids, j, i)
	}
}

func (m *model) clear(i uint64) {
	if j, ok := slices.BinarySearch(m.ids, i); ok {
		m.ids = slices.Delete(m.ids, j, j+1)
	}
}

// setRun sets ids [lo, hi).
func (m *model) setRun(lo, hi uint64) {
	j, _ := slices.BinarySearch(m.ids, lo)
	k, _ := slices.BinarySearch(m.ids, hi)
	run := make([]uint64, 0, hi-lo)
	for i := lo; i < hi; i++ {
		run = append(run, i)
	}
	m.ids = slices.Concat(m.ids[:j], run, m.ids[k:])
}

// clearRun clears ids [lo, hi).
func (m *model) clearRun(lo, hi uint64) {
	j, _ := slices.BinarySearch(m.ids, lo)
	k, _ := slices.BinarySearch(m.ids, hi)
	m.ids = slices.Delete(m.ids, j, k)
}

func (m *model) test(i uint64) bool {
	_, ok := slices.BinarySearch(m.ids, i)
	return ok
}

func (m *model) nextSet(from uint64) (uint64, bool) {
	j, _ := slices.BinarySearch(m.ids, from)
	if j == len(m.ids) {
		return 0, false
	}
	return m.ids[j], true
}

func (m *model) nextClear(from uint64) (uint64, bool) {
	if from > MaxID {
		return from, false
	}
	j, _ := slices.BinarySearch(m.ids, from)
	for ; j < len(m.ids) && m.ids[j] == from; j++ {
		if from == MaxID {
			return 0, false
		}
		from++
	}
	return from, true
}

func (m *model) rangeIDs(lo, hi uint64) []uint64 {
	j, _ := slices.BinarySearch(m.ids, lo)
	k, _ := slices.BinarySearch(m.ids, hi)
	if lo >= hi {
		return nil
	}
	return m.ids[j:k]
}

func (m *model) last() (uint64, bool) {
	if len(m.ids) == 0 {
		return 0, false
	}
	return m.ids[len(m.ids)-1], true
}

type opKind uint8

const (
	opSet opKind = iota
	opClear
	opSetRun   // ids [a, a+b)
	opClearRun // ids [a, a+b)
	opTest
	opNextSet
	opNextClear
	opRange // ids [a, a+b)
	opClone
	opReset
	opCheck
	opWords // groups of [a, a+b)
	opWord
	opSetWord // word a>>6 |= b
	opRebuild // a new tree from Words through SetWord, last word first
	opKinds
)

var opNames = [...]string{"Set", "Clear", "SetRun", "ClearRun", "Test", "NextSet", "NextClear",
	"Range", "Clone", "Reset", "Check", "Words", "Word", "SetWord", "Rebuild"}

type op struct {
	kind opKind
	a, b uint64
}

func (o op) String() string { return fmt.Sprintf("%s(%d,%d)", opNames[o.kind], o.a, o.b) }

// runEnd returns a+b clamped to MaxID+1.
func runEnd(a, b uint64) uint64 {
	if a > MaxID || b > MaxID+1-a {
		return MaxID + 1
	}
	return a + b
}

// harness holds the tree under test and its model.
type harness struct {
	t    require.TestingT
	tree *Tree
	m    model
}

// apply runs o on both and compares every answer, plus Count and Last after it.
func (h *harness) apply(o op) {
	t := h.t
	switch o.kind {
	case opSet:
		if o.a > MaxID {
			require.Panics(t, func() { h.tree.Set(o.a) }, "%v", o)
			break
		}
		h.tree.Set(o.a)
		h.m.set(o.a)
	case opClear:
		h.tree.Clear(o.a)
		h.m.clear(o.a)
	case opSetRun:
		end := runEnd(o.a, o.b)
		for i := o.a; i < end; i++ {
			h.tree.Set(i)
		}
		if o.a < end {
			h.m.setRun(o.a, end)
		}
	case opClearRun:
		end := runEnd(o.a, o.b)
		for i := o.a; i < end; i++ {
			h.tree.Clear(i)
		}
		if o.a < end {
			h.m.clearRun(o.a, end)
		}
	case opTest:
		same(h, h.m.test(o.a), h.tree.Test(o.a), "Test", o)
	case opNextSet:
		id, ok := h.tree.NextSet(o.a)
		wantID, wantOK := h.m.nextSet(o.a)
		same(h, wantOK, ok, "NextSet found", o)
		if ok {
			same(h, wantID, id, "NextSet", o)
		}
	case opNextClear:
		id, ok := h.tree.NextClear(o.a)
		wantID, wantOK := h.m.nextClear(o.a)
		same(h, wantOK, ok, "NextClear found", o)
		if ok {
			same(h, wantID, id, "NextClear", o)
		}
	case opRange:
		got := []uint64{}
		for x := range h.tree.Range(o.a, runEnd(o.a, o.b)) {
			got = append(got, x)
		}
		if want := h.m.rangeIDs(o.a, runEnd(o.a, o.b)); !slices.Equal(want, got) {
			require.Equal(t, append([]uint64{}, want...), got, "%v", o)
		}
	case opClone:
		c := h.tree.Clone()
		h.tree.Reset() // the clone must not share memory with the original
		h.tree = c
	case opReset:
		h.tree.Reset()
		h.m = model{}
	case opCheck:
		h.checkAll()
	case opWords:
		var got, want [][2]uint64
		for first, w := range h.tree.Words(o.a, runEnd(o.a, o.b)) {
			got = append(got, [2]uint64{first, w})
		}
		for _, x := range h.m.rangeIDs(o.a, runEnd(o.a, o.b)) {
			if len(want) == 0 || want[len(want)-1][0] != x&^63 {
				want = append(want, [2]uint64{x &^ 63, 0})
			}
			want[len(want)-1][1] |= 1 << (x & 63)
		}
		if !slices.Equal(want, got) {
			require.Equal(t, want, got, "%v", o)
		}
	case opSetWord:
		if o.b != 0 && o.a>>6 > MaxID>>6 {
			require.Panics(t, func() { h.tree.SetWord(o.a>>6, o.b) }, "%v", o)
			break
		}
		h.tree.SetWord(o.a>>6, o.b)
		for w := o.b; w != 0; w &= w - 1 {
			h.m.set(o.a&^63 + uint64(bits.TrailingZeros64(w)))
		}
	case opRebuild:
		var words [][2]uint64
		for first, w := range h.tree.Words(0, MaxID+1) {
			words = append(words, [2]uint64{first, w})
		}
		n := New()
		for _, fw := range slices.Backward(words) { // any order must do: a loader's map order
			n.SetWord(fw[0]>>6, fw[1])
		}
		require.NoError(t, n.verify(), "%v", o)
		h.tree = n
	case opWord:
		var want uint64
		for _, x := range h.m.rangeIDs(o.a&^63, o.a&^63+64) {
			want |= 1 << (x & 63)
		}
		same(h, want, h.tree.Word(o.a), "Word", o)
	}
	same(h, uint64(len(h.m.ids)), h.tree.Count(), "Count after", o)
	id, ok := h.tree.Last()
	wantID, wantOK := h.m.last()
	same(h, wantOK, ok, "Last found after", o)
	same(h, wantID, id, "Last after", o)
}

// same fails the test if got differs from want; it allocates nothing when they agree, which
// keeps the fuzz targets fast.
func same[T comparable](h *harness, want, got T, what string, o op) {
	if want != got {
		require.Equal(h.t, want, got, "%s %v", what, o)
	}
}

// checkAll verifies the tree's invariants and compares every id.
func (h *harness) checkAll() {
	require.NoError(h.t, h.tree.verify())
	got := make([]uint64, 0, len(h.m.ids))
	for x := range h.tree.All() {
		got = append(got, x)
	}
	if !slices.Equal(h.m.ids, got) {
		require.Equal(h.t, append([]uint64{}, h.m.ids...), got)
	}
}

// shape draws ids from one kind of id space.
type shape struct {
	name   string
	id     func(r *rand.Rand) uint64
	runMax uint64 // longest run of SetRun and ClearRun
	ops    int
}

var shapes = []shape{
	{"small", func(r *rand.Rand) uint64 { return r.Uint64N(300) }, 70, 3000},
	{"clustered", func(r *rand.Rand) uint64 { return r.Uint64N(1 << r.UintN(17)) }, 5000, 3000},
	{"sparse36", func(r *rand.Rand) uint64 { return r.Uint64N(1 << 36) }, 300, 3000},
	{"dense", func(r *rand.Rand) uint64 { return r.Uint64N(1 << 19) }, 1 << 17, 1500},
	{"top", func(r *rand.Rand) uint64 { return MaxID - r.Uint64N(1<<14) }, 1 << 12, 2000},
}

// randomOp draws an operation; half of the ids it names are near ids already set, so Clear
// and the queries land on interesting places even in sparse spaces.
func randomOp(r *rand.Rand, s shape, m *model) op {
	id := func() uint64 {
		if len(m.ids) > 0 && r.IntN(2) == 0 {
			x := m.ids[r.IntN(len(m.ids))] + r.Uint64N(130) - 65
			return min(x, MaxID+1) // may wrap below 0 to a huge id: fine, also an id to test
		}
		return s.id(r)
	}
	switch p := r.IntN(1000); {
	case p < 250:
		return op{opSet, id(), 0}
	case p < 400:
		return op{opClear, id(), 0}
	case p < 440:
		return op{opSetRun, id(), r.Uint64N(s.runMax + 1)}
	case p < 470:
		return op{opClearRun, id(), r.Uint64N(s.runMax + 1)}
	case p < 580:
		return op{opTest, id(), 0}
	case p < 700:
		return op{opNextSet, id(), 0}
	case p < 820:
		return op{opNextClear, id(), 0}
	case p < 870:
		return op{opRange, id(), r.Uint64N(5000)}
	case p < 885:
		return op{opWords, id(), r.Uint64N(10000)}
	case p < 900:
		return op{opWord, id(), 0}
	case p < 925:
		return op{opSetWord, id(), r.Uint64() & r.Uint64()}
	case p < 930:
		return op{opRebuild, 0, 0}
	case p < 945:
		return op{opClone, 0, 0}
	case p < 950:
		return op{opReset, 0, 0}
	default:
		return op{opCheck, 0, 0}
	}
}

// testSeed returns the seed of the random tests: WEFT_SEED if set, else a fresh one.
func testSeed(t *testing.T) uint64 { return testseed.Seed(t) }

// TestModel runs thousands of random operations per id-space shape against the model. The
// seed is logged; WEFT_SEED=<seed> replays a run.
func TestModel(t *testing.T) {
	seed := testSeed(t)
	t.Logf("seed %d (replay: WEFT_SEED=%d go test -run TestModel ./bitmaptree)", seed, seed)
	for si, s := range shapes {
		t.Run("shape="+s.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, uint64(si)))
			h := &harness{t: t, tree: New()}
			var last [8]op // the tail of the history, for the failure message
			for n := range s.ops {
				o := randomOp(r, s, &h.m)
				last[n%len(last)] = o
				func() {
					defer func() {
						if t.Failed() {
							var recent []op
							for j := max(0, n+1-len(last)); j <= n; j++ {
								recent = append(recent, last[j%len(last)])
							}
							t.Logf("seed %d shape %s failed at op %d; last ops %v", seed, s.name, n, recent)
						}
					}()
					h.apply(o)
				}()
			}
			h.checkAll()
			h.apply(op{opRebuild, 0, 0})
			h.checkAll()
		})
	}
}

// TestModelRapid runs short operation sequences under rapid, which shrinks a failure to a
// minimal sequence.
func TestModelRapid(t *testing.T) {
	bases := []uint64{0, 4096 - 100, 1 << 30, MaxID - 300}
	rapid.Check(t, func(rt *rapid.T) {
		base := rapid.SampledFrom(bases).Draw(rt, "base")
		idGen := rapid.Custom(func(rt *rapid.T) uint64 {
			return min(base+rapid.Uint64Range(0, 400).Draw(rt, "off"), MaxID+1)
		})
		h := &harness{t: rt, tree: New()}
		rt.Repeat(map[string]func(*rapid.T){
			"Set": func(rt *rapid.T) {
				if id := idGen.Draw(rt, "id"); id <= MaxID {
					h.apply(op{opSet, id, 0})
				}
			},
			"Clear": func(rt *rapid.T) { h.apply(op{opClear, idGen.Draw(rt, "id"), 0}) },
			"SetRun": func(rt *rapid.T) {
				h.apply(op{opSetRun, idGen.Draw(rt, "id"), rapid.Uint64Range(0, 300).Draw(rt, "n")})
			},
			"ClearRun": func(rt *rapid.T) {
				h.apply(op{opClearRun, idGen.Draw(rt, "id"), rapid.Uint64Range(0, 300).Draw(rt, "n")})
			},
			"Test":      func(rt *rapid.T) { h.apply(op{opTest, idGen.Draw(rt, "id"), 0}) },
			"NextSet":   func(rt *rapid.T) { h.apply(op{opNextSet, idGen.Draw(rt, "id"), 0}) },
			"NextClear": func(rt *rapid.T) { h.apply(op{opNextClear, idGen.Draw(rt, "id"), 0}) },
			"Range":     func(rt *rapid.T) { h.apply(op{opRange, idGen.Draw(rt, "id"), rapid.Uint64Range(0, 500).Draw(rt, "n")}) },
			"Words":     func(rt *rapid.T) { h.apply(op{opWords, idGen.Draw(rt, "id"), rapid.Uint64Range(0, 500).Draw(rt, "n")}) },
			"Word":      func(rt *rapid.T) { h.apply(op{opWord, idGen.Draw(rt, "id"), 0}) },
			"SetWord":   func(rt *rapid.T) { h.apply(op{opSetWord, idGen.Draw(rt, "id"), rapid.Uint64().Draw(rt, "word")}) },
			"Rebuild":   func(rt *rapid.T) { h.apply(op{opRebuild, 0, 0}) },
			"":          func(rt *rapid.T) { h.checkAll() },
		})
	})
}
