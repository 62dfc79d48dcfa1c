package logicpage

import (
	"bytes"
	"math"
	"math/bits"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/corrupt"
)

// fuzzRowBytes are the row sizes the fuzzer's selector byte picks from. Small sizes come first
// and repeat, so random row bytes often have a length a small geometry accepts.
var fuzzRowBytes = []int{8, 16, 8, 24, 64, 72, 8, 136, 4096}

// FuzzSegment feeds CheckSegment arbitrary segments. It must never panic; it must accept exactly
// the well-formed ones; and an accepted segment must survive Apply then Gather unchanged,
// ApplyOnly must match the slot-by-slot model, and clears must zero their rows.
func FuzzSegment(f *testing.F) {
	rows := func(n int, b byte) []byte { return bytes.Repeat([]byte{b}, n) }
	f.Add(uint8(0), uint64(0), uint64(0), uint64(0), []byte{})
	f.Add(uint8(0), uint64(7), uint64(1), uint64(2), rows(8, 0xab))
	f.Add(uint8(1), uint64(1), uint64(0b1011), uint64(0b0100), rows(3*16, 1))
	f.Add(uint8(4), uint64(PageMax), uint64(1<<63), uint64(1), rows(64, 0x5a))
	f.Add(uint8(0), uint64(3), uint64(math.MaxUint64), uint64(0), rows(512, 7))
	f.Add(uint8(0), uint64(3), uint64(0), uint64(math.MaxUint64), []byte{})
	f.Add(uint8(0), uint64(3), uint64(0x5555555555555555), uint64(0xaaaaaaaaaaaaaaaa), rows(256, 9))
	f.Add(uint8(5), uint64(3), uint64(0b11), uint64(0), rows(144, 2))
	// Malformed: overlap, short, long, rows without data, page beyond ids.
	f.Add(uint8(0), uint64(1), uint64(0b11), uint64(0b10), rows(16, 3))
	f.Add(uint8(0), uint64(1), uint64(0b111), uint64(0), rows(16, 3))
	f.Add(uint8(0), uint64(1), uint64(0b1), uint64(0), rows(9, 3))
	f.Add(uint8(0), uint64(1), uint64(0), uint64(1), rows(8, 3))
	f.Add(uint8(0), uint64(PageMax+1), uint64(0), uint64(0), []byte{})

	f.Fuzz(func(t *testing.T, sel uint8, page, data, clr uint64, rowBytes []byte) {
		r := fuzzRowBytes[int(sel)%len(fuzzRowBytes)]
		g := mustGeometry(t, r)
		s := base.Segment{Page: page, Data: data, Clear: clr, Rows: rowBytes}

		err := g.CheckSegment(s)
		wellFormed := page <= PageMax && data&clr == 0 && len(rowBytes) == bits.OnesCount64(data)*r
		if !wellFormed {
			require.ErrorIs(t, err, ErrSegment)
			require.ErrorIs(t, err, corrupt.ErrCorruption)
			return
		}
		require.NoError(t, err)

		// Onto an empty frame: exactly the data rows arrive, and Gather gives them back.
		empty := newFrame(t, g)
		empty.Apply(s)
		require.Equal(t, Masks{Present: data}, *empty.Masks)
		var got []byte
		for _, b := range empty.Gather(data, nil) {
			got = append(got, b...)
		}
		require.True(t, bytes.Equal(rowBytes, got), "round trip")
		for slot := range RowsPerPage {
			if data&(1<<slot) == 0 {
				require.Equal(t, make([]byte, r), empty.Row(slot), "slot %d outside data stays zero", slot)
			}
		}

		// Onto a full frame, restricted to a mask derived from the inputs: the model decides.
		into := data ^ bits.RotateLeft64(clr, int(page%64)) ^ page
		for _, v := range applyVariants {
			full := newFrame(t, g)
			for i := range full.Rows {
				full.Rows[i] = byte(i*7 + 1)
			}
			full.Masks.Present = math.MaxUint64 ^ page
			wantRows, wantPresent := applyModel(full.Rows, full.Masks.Present, r, s, v.honoured(into))
			v.apply(full, s, into)
			require.Equal(t, wantPresent, full.Masks.Present, v.name)
			require.True(t, bytes.Equal(wantRows, full.Rows), v.name)
		}
	})
}
