package logicpage

import (
	"bytes"
	"math"
	"math/bits"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/corrupt"
)

// fixedMasks are the shapes that break mask walks: none, all, the ends, runs touching bit 63.
var fixedMasks = []uint64{
	0, math.MaxUint64, 1, 1 << 63, 0b11, 3 << 62, 0x00000000000000ff, 0xff00000000000000,
	0x5555555555555555, 0xaaaaaaaaaaaaaaaa, 0x0f0f0f0f0f0f0f0f, 0x7ffffffffffffffe,
	0x8000000000000001, 0x00ffff0000ffff00, math.MaxUint64 >> 1, math.MaxUint64 - 1,
}

// randomMask returns a mask of a random shape: uniform, sparse, dense or one run.
func randomMask(rng *rand.Rand) uint64 {
	switch rng.IntN(5) {
	case 0:
		return rng.Uint64()
	case 1:
		return rng.Uint64() & rng.Uint64() & rng.Uint64()
	case 2:
		return rng.Uint64() | rng.Uint64() | rng.Uint64()
	case 3:
		first, n := rng.IntN(64), 1+rng.IntN(64)
		return runMask(first, min(n, 64-first))
	default:
		return fixedMasks[rng.IntN(len(fixedMasks))]
	}
}

// runCount returns the number of runs of adjacent set bits in mask.
func runCount(mask uint64) int { return bits.OnesCount64(mask &^ (mask << 1)) }

// gatherRows gathers mask from f and returns the rows concatenated, as a decoder would land
// them, checking the shape of the gathered slices on the way.
func gatherRows(tb testing.TB, f Frame, mask uint64) []byte {
	tb.Helper()
	slices := f.Gather(mask, nil)
	require.Len(tb, slices, runCount(mask), "one slice per run of mask %#x", mask)
	var out []byte
	for _, s := range slices {
		require.Positive(tb, len(s))
		require.Zero(tb, len(s)%f.Geometry().RowBytes())
		require.Equal(tb, len(s), cap(s), "capacity ends at the run")
		out = append(out, s...)
	}
	require.Len(tb, out, f.Geometry().MaskBytes(mask))
	return out
}

func TestCheckSegment(t *testing.T) {
	g := mustGeometry(t, 64)
	rows := func(n int) []byte { return make([]byte, n*64) }
	tests := []struct {
		name string
		s    base.Segment
		ok   bool
	}{
		{"empty", base.Segment{}, true},
		{"empty rows not nil", base.Segment{Rows: []byte{}}, true},
		{"one row", base.Segment{Page: 9, Data: 1 << 5, Rows: rows(1)}, true},
		{"clear only", base.Segment{Page: 9, Clear: 0xf0}, true},
		{"data and clear", base.Segment{Data: 0b0101, Clear: 0b1010, Rows: rows(2)}, true},
		{"full page", base.Segment{Data: math.MaxUint64, Rows: rows(64)}, true},
		{"full clear", base.Segment{Clear: math.MaxUint64}, true},
		{"last page", base.Segment{Page: PageMax, Data: 1 << 63, Rows: rows(1)}, true},
		{"page beyond ids", base.Segment{Page: PageMax + 1}, false},
		{"page max uint64", base.Segment{Page: math.MaxUint64, Data: 1, Rows: rows(1)}, false},
		{"masks overlap", base.Segment{Data: 0b11, Clear: 0b10, Rows: rows(2)}, false},
		{"masks overlap at 63", base.Segment{Data: 1 << 63, Clear: math.MaxUint64, Rows: rows(1)}, false},
		{"rows short", base.Segment{Data: 0b111, Rows: rows(2)}, false},
		{"rows short by a byte", base.Segment{Data: 1, Rows: make([]byte, 63)}, false},
		{"rows long", base.Segment{Data: 0b1, Rows: rows(2)}, false},
		{"rows without data", base.Segment{Clear: 1, Rows: rows(1)}, false},
		{"rows missing", base.Segment{Data: math.MaxUint64}, false},
	}
	for _, tt := range tests {
		err := g.CheckSegment(tt.s)
		if tt.ok {
			require.NoError(t, err, tt.name)
			continue
		}
		require.ErrorIs(t, err, ErrSegment, tt.name)
		require.ErrorIs(t, err, corrupt.ErrCorruption, tt.name)
	}
}

func TestCheckSegmentRowSize(t *testing.T) {
	for _, r := range testRowBytes {
		g := mustGeometry(t, r)
		require.NoError(t, g.CheckSegment(base.Segment{Data: 0b1001, Rows: make([]byte, 2*r)}))
		require.Error(t, g.CheckSegment(base.Segment{Data: 0b1001, Rows: make([]byte, 2*r+8)}))
		require.Error(t, g.CheckSegment(base.Segment{Data: 0b1001, Rows: make([]byte, 2*r-8)}))
	}
}

func TestGatherCoalescesRuns(t *testing.T) {
	g := mustGeometry(t, 64)
	f := newFrame(t, g)
	tests := []struct {
		mask  uint64
		spans [][2]int // [first slot, slot count] of each slice
	}{
		{0, nil},
		{1, [][2]int{{0, 1}}},
		{1 << 63, [][2]int{{63, 1}}},
		{math.MaxUint64, [][2]int{{0, 64}}},
		{0xff << 8, [][2]int{{8, 8}}},
		{0b1011, [][2]int{{0, 2}, {3, 1}}},
		{0x8000000000000001, [][2]int{{0, 1}, {63, 1}}},
		{math.MaxUint64 - 1, [][2]int{{1, 63}}},
		{3<<62 | 3<<30, [][2]int{{30, 2}, {62, 2}}},
	}
	for _, tt := range tests {
		got := f.Gather(tt.mask, nil)
		require.Len(t, got, len(tt.spans), "mask %#x", tt.mask)
		for i, span := range tt.spans {
			lo, hi := span[0]*64, (span[0]+span[1])*64
			require.Same(t, &f.Rows[lo], &got[i][0], "mask %#x slice %d aliases the frame", tt.mask, i)
			require.Len(t, got[i], hi-lo, "mask %#x slice %d", tt.mask, i)
		}
	}
	// A spread mask is the worst case: 32 slices for one page.
	require.Len(t, f.Gather(0x5555555555555555, nil), 32)
	// Gather appends.
	dst := f.Gather(1, nil)
	dst = f.Gather(1<<5, dst)
	require.Len(t, dst, 2)
	require.Same(t, &f.Rows[5*64], &dst[1][0])
}

// TestGatherApplyRoundTrip gathers a mask from a random frame, concatenates the rows, applies
// them as a segment to an empty frame and checks that exactly those rows and bits arrived.
func TestGatherApplyRoundTrip(t *testing.T) {
	rng, seed := newRand(t)
	for _, r := range testRowBytes {
		g := mustGeometry(t, r)
		masks := append([]uint64(nil), fixedMasks...)
		for range 200 {
			masks = append(masks, randomMask(rng))
		}
		for _, mask := range masks {
			src := randomFrame(t, g, rng)
			s := base.Segment{Page: rng.Uint64() >> 6, Data: mask, Rows: gatherRows(t, src, mask)}
			require.NoError(t, g.CheckSegment(s))

			dst := newFrame(t, g)
			dst.Apply(s)
			require.Equal(t, Masks{Present: mask}, *dst.Masks, "seed %d row size %d mask %#x", seed, r, mask)
			for slot := range RowsPerPage {
				want := make([]byte, r)
				if mask&(1<<slot) != 0 {
					want = src.Row(slot)
				}
				require.Equal(t, want, dst.Row(slot), "seed %d row size %d mask %#x slot %d", seed, r, mask, slot)
			}
			require.Equal(t, s.Rows, gatherRows(t, dst, mask))
		}
	}
}

// applyModel is the obvious slot-by-slot definition of ApplyOnly: the model the mask walks are
// checked against.
func applyModel(rows []byte, present uint64, r int, s base.Segment, into uint64) ([]byte, uint64) {
	out := bytes.Clone(rows)
	next := 0
	for slot := range RowsPerPage {
		bit := uint64(1) << slot
		switch {
		case s.Data&bit != 0:
			if into&bit != 0 {
				copy(out[slot*r:(slot+1)*r], s.Rows[next:next+r])
				present |= bit
			}
			next += r
		case s.Clear&bit != 0 && into&bit != 0:
			clear(out[slot*r : (slot+1)*r])
			present &^= bit
		}
	}
	return out, present
}

// randomSegment returns a well-formed segment of random masks and bytes.
func randomSegment(rng *rand.Rand, g Geometry) base.Segment {
	data := randomMask(rng)
	s := base.Segment{Page: rng.Uint64N(PageMax + 1), Data: data, Clear: randomMask(rng) &^ data}
	s.Rows = make([]byte, g.MaskBytes(data))
	fillRandom(rng, s.Rows)
	return s
}

// applyVariant is one of the four ways to apply a segment.
type applyVariant struct {
	name  string
	only  bool // honours into; the others apply every slot
	apply func(f Frame, s base.Segment, into uint64)
}

// honoured returns the slots the variant writes when asked for into.
func (v applyVariant) honoured(into uint64) uint64 {
	if v.only {
		return into
	}
	return math.MaxUint64
}

var applyVariants = []applyVariant{
	{"Apply", false, func(f Frame, s base.Segment, _ uint64) { f.Apply(s) }},
	{"ApplyOnly", true, func(f Frame, s base.Segment, into uint64) { f.ApplyOnly(s, into) }},
	{"ApplyShared", false, func(f Frame, s base.Segment, _ uint64) { f.ApplyShared(s) }},
	{"ApplyOnlyShared", true, func(f Frame, s base.Segment, into uint64) { f.ApplyOnlyShared(s, into) }},
}

// TestApplyModel applies random segments through every variant to random frames and compares
// with applyModel, slot by slot.
func TestApplyModel(t *testing.T) {
	rng, seed := newRand(t)
	for _, v := range applyVariants {
		for _, r := range testRowBytes {
			g := mustGeometry(t, r)
			f := randomFrame(t, g, rng)
			steps := 300
			if r > 1024 {
				steps = 50 // big pages: fewer steps keep -race fast, the walks are the same
			}
			for step := range steps {
				s := randomSegment(rng, g)
				into := randomMask(rng)
				before := *f.Masks
				rows, present := bytes.Clone(f.Rows), f.Masks.Present

				v.apply(f, s, into)

				wantRows, wantPresent := applyModel(rows, present, r, s, v.honoured(into))
				require.Equal(t, wantPresent, f.Masks.Present, "%s seed %d row size %d step %d", v.name, seed, r, step)
				require.True(t, bytes.Equal(wantRows, f.Rows), "%s seed %d row size %d step %d", v.name, seed, r, step)
				require.Equal(t, before.Valid, f.Masks.Valid, "apply leaves valid alone")
				require.Equal(t, before.Dirty, f.Masks.Dirty, "apply leaves dirty alone")
			}
		}
	}
}

// TestApplyOnlyFillRule is the transaction node's fill: a write landed in slot 2 while a miss for
// slots 1..3 was in flight; the fill must not overwrite it with older bytes.
func TestApplyOnlyFillRule(t *testing.T) {
	g := mustGeometry(t, 8)
	f := newFrame(t, g)
	copy(f.Row(2), "newwrite")
	f.Masks.Present, f.Masks.Valid = 1<<2, 1<<2

	fill := base.Segment{Data: 0b0110, Clear: 0b1000, Rows: []byte("row one!oldbytes")}
	f.ApplyOnly(fill, ^f.Masks.Valid)

	require.Equal(t, []byte("row one!"), f.Row(1))
	require.Equal(t, []byte("newwrite"), f.Row(2))
	require.Equal(t, uint64(0b0110), f.Masks.Present)

	// Applied whole, the same segment overwrites slot 2.
	f.Apply(fill)
	require.Equal(t, []byte("oldbytes"), f.Row(2))
}

func TestApplyClearZeroesRows(t *testing.T) {
	rng, _ := newRand(t)
	g := mustGeometry(t, 64)
	f := randomFrame(t, g, rng)
	f.Masks.Present = math.MaxUint64
	f.Apply(base.Segment{Clear: 0xf0f0})
	require.Equal(t, ^uint64(0xf0f0), f.Masks.Present)
	for slot := range RowsPerPage {
		if 0xf0f0&(1<<slot) != 0 {
			require.Equal(t, make([]byte, 64), f.Row(slot), "slot %d", slot)
		}
	}
}

func TestApplyPanicsOnUncheckedSegment(t *testing.T) {
	g := mustGeometry(t, 64)
	f := newFrame(t, g)
	for _, v := range applyVariants {
		require.Panics(t, func() { v.apply(f, base.Segment{Data: 1, Clear: 1, Rows: make([]byte, 64)}, 1) }, v.name)
		require.Panics(t, func() { v.apply(f, base.Segment{Data: 1, Rows: make([]byte, 8)}, 1) }, v.name)
	}
}

// TestApplySharedConcurrent applies segments with ApplyShared while readers LoadRow and load
// Present atomically: under -race the detector must stay silent. Every row written holds one
// byte value repeated, so a reader also checks that each word it sees is whole.
func TestApplySharedConcurrent(t *testing.T) {
	const applyCount = 2000
	g := mustGeometry(t, 64)
	f := newFrame(t, g)
	var done atomic.Bool
	var torn atomic.Int64
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			out := make([]byte, 64)
			for reads := 0; !done.Load() || reads < 100; reads++ {
				_ = atomic.LoadUint64(&f.Masks.Present)
				LoadRow(out, f.Row(reads%RowsPerPage))
				for w := 0; w < 64; w += 8 {
					if !bytes.Equal(out[w:w+8], bytes.Repeat(out[w:w+1], 8)) {
						torn.Add(1)
					}
				}
			}
		})
	}
	rows := make([]byte, g.PageBytes())
	for i := range applyCount {
		data := uint64(0xff) << (i % 57)
		clr := uint64(1) << ((i + 9) % 64) &^ data
		b := rows[:g.MaskBytes(data)]
		for j := range b {
			b[j] = byte(i)
		}
		f.ApplyShared(base.Segment{Data: data, Clear: clr, Rows: b})
	}
	done.Store(true)
	wg.Wait()
	require.Zero(t, torn.Load(), "torn words seen")
}
