package logicpage

import (
	"encoding/binary"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// testRowBytes are the row sizes the tests sweep: the smallest, the default, sizes that leave a
// tail after LoadRow's 64-byte blocks, and the largest.
var testRowBytes = []int{8, 16, 24, 64, 72, 136, 520, 4096}

// newFrame returns a frame of zeroed rows and masks, in its own aligned memory.
func newFrame(tb testing.TB, g Geometry) Frame {
	tb.Helper()
	return g.Frame(AlignedBytes(g.PageBytes()), &Masks{})
}

// randomFrame returns a frame of random bytes and random masks.
func randomFrame(tb testing.TB, g Geometry, rng *rand.Rand) Frame {
	tb.Helper()
	f := newFrame(tb, g)
	fillRandom(rng, f.Rows)
	*f.Masks = Masks{Present: rng.Uint64(), Valid: rng.Uint64(), Dirty: rng.Uint64()}
	return f
}

func fillRandom(rng *rand.Rand, b []byte) {
	for len(b) >= 8 {
		binary.NativeEndian.PutUint64(b, rng.Uint64())
		b = b[8:]
	}
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
}

// newRand returns a seeded generator and logs the seed, so a failure replays.
func newRand(tb testing.TB) (*rand.Rand, uint64) {
	tb.Helper()
	seed := rand.Uint64()
	tb.Logf("seed %d", seed)
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), seed
}

func TestFrame(t *testing.T) {
	for _, r := range testRowBytes {
		g := mustGeometry(t, r)
		m := &Masks{Present: 5}
		rows := AlignedBytes(g.PageBytes())
		f := g.Frame(rows, m)
		require.Equal(t, g, f.Geometry())
		require.Same(t, m, f.Masks)
		require.Same(t, &rows[0], &f.Rows[0])
		for slot := range RowsPerPage {
			row := f.Row(slot)
			require.Len(t, row, r)
			require.Equal(t, r, cap(row), "a row's capacity ends at the row")
			require.Same(t, &rows[g.RowOffset(slot)], &row[0], "the row aliases the frame")
			row[0] = byte(slot + 1)
		}
		for slot := range RowsPerPage {
			require.Equal(t, byte(slot+1), rows[slot*r])
		}
	}
}

func TestFramePanicsOnBadMemory(t *testing.T) {
	g := mustGeometry(t, 64)
	n := g.PageBytes()
	require.Panics(t, func() { g.Frame(AlignedBytes(n-8), &Masks{}) }, "short")
	require.Panics(t, func() { g.Frame(AlignedBytes(n+8), &Masks{}) }, "long")
	require.Panics(t, func() { g.Frame(AlignedBytes(n), nil) }, "nil masks")
	require.Panics(t, func() { g.Frame(AlignedBytes(n + 8)[4:4+n], &Masks{}) }, "misaligned")
	require.Panics(t, func() { Geometry{}.Frame(nil, &Masks{}) }, "zero geometry")
}

func TestAlignedBytes(t *testing.T) {
	for _, n := range []int{0, 1, 7, 8, 9, 64, 4096, 4100, 1 << 20} {
		b := AlignedBytes(n)
		require.NotNil(t, b)
		require.Len(t, b, n)
		require.True(t, aligned(b))
		require.Equal(t, make([]byte, n), b, "zeroed")
		if n > 0 {
			require.Zero(t, uintptr(unsafe.Pointer(&b[0]))%8)
			b[n-1] = 1 // the whole length is writable
		}
	}
	require.Panics(t, func() { AlignedBytes(-1) })
}

func TestLoadStoreRow(t *testing.T) {
	rng, _ := newRand(t)
	for _, r := range testRowBytes {
		shared := AlignedBytes(r)
		// The private side may sit at any alignment.
		for off := range 8 {
			private := make([]byte, r+off)[off:]
			fillRandom(rng, private)
			StoreRow(shared, private)
			require.Equal(t, private, shared, "row size %d offset %d", r, off)

			out := make([]byte, r+off)[off:]
			LoadRow(out, shared)
			require.Equal(t, shared, out, "row size %d offset %d", r, off)
		}
	}
	LoadRow(nil, nil)
	StoreRow(nil, nil)
}

func TestLoadStoreRowPanics(t *testing.T) {
	buf := AlignedBytes(80)
	tests := []struct {
		name     string
		dst, src []byte
	}{
		{"lengths differ", buf[:64], buf[:72]},
		{"not words", buf[:12], buf[16:28]},
		{"shared misaligned", buf[4:68], buf[8:72]},
	}
	for _, tt := range tests {
		// LoadRow's shared side is src, StoreRow's is dst: misalign each.
		require.Panics(t, func() { LoadRow(tt.src, tt.dst) }, "load: %s", tt.name)
		require.Panics(t, func() { StoreRow(tt.dst, tt.src) }, "store: %s", tt.name)
	}
}

// TestLoadStoreRowConcurrent has one goroutine StoreRow while others LoadRow the same row. Word
// w of store number i holds i<<8 | w: a reader must see, in each word, a value some store wrote
// to that word, never decreasing from one load to the next (the writer counts up). Run it under
// -race: the detector must report nothing.
func TestLoadStoreRowConcurrent(t *testing.T) {
	const (
		storeCount  = 20000
		readerCount = 3
		rowBytes    = 136 // two 64-byte blocks and a tail word
		words       = rowBytes / 8
	)
	shared := AlignedBytes(rowBytes)
	var done atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan string, readerCount)
	for range readerCount {
		wg.Go(func() {
			out := make([]byte, rowBytes)
			var last [words]uint64
			for loads := 0; !done.Load() || loads < 100; loads++ {
				LoadRow(out, shared)
				for w := range words {
					v := binary.NativeEndian.Uint64(out[8*w:])
					if v == 0 {
						continue // before the first store
					}
					if v&0xff != uint64(w) || v>>8 > storeCount || v < last[w] {
						errs <- "torn or stale word"
						return
					}
					last[w] = v
				}
			}
		})
	}
	private := make([]byte, rowBytes)
	for i := uint64(1); i <= storeCount; i++ {
		for w := range words {
			binary.NativeEndian.PutUint64(private[8*w:], i<<8|uint64(w))
		}
		StoreRow(shared, private)
	}
	done.Store(true)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	out := make([]byte, rowBytes)
	LoadRow(out, shared)
	require.Equal(t, private, out)
}
