package commitbody

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/corrupt"
)

// rows returns n rows of rowBytes bytes of the byte seed.
func rows(n, rowBytes int, seed byte) []byte { return bytes.Repeat([]byte{seed}, n*rowBytes) }

// collect returns v's fences and segments, the segments' rows aliasing v's body.
func collect(v *View) (fences []base.Fence, segs []base.Segment) {
	for i := range v.FenceCount() {
		fences = append(fences, v.Fence(i))
	}
	it := v.Segments()
	for s := (base.Segment{}); it.Next(&s); {
		segs = append(segs, s)
	}
	return fences, segs
}

// joinRows returns the rows of segs, copied, back to back.
func joinRows(segs []base.Segment) []byte {
	var b []byte
	for i := range segs {
		b = append(b, segs[i].Rows...)
	}
	return b
}

// flip inverts every bit of b and returns it.
func flip(b []byte) []byte {
	for i := range b {
		b[i] ^= 0xff
	}
	return b
}

// sampleBodies returns valid Commit bodies: the golden one, an empty one, fences without
// segments, a clear-only segment and a full page of the largest rows.
func sampleBodies() [][]byte {
	owner, seq, fences, segs := goldenBody()
	return [][]byte{
		appendBody(nil, owner, seq, fences, segs),
		appendBody(nil, 0, 0, nil, nil),
		appendBody(nil, 1<<63, 1, []base.Fence{{Table: 9, Epoch: 1 << 40}}, nil),
		appendBody(nil, 2, 3, []base.Fence{{Table: 1, Epoch: 1}}, []base.Segment{{Table: 1, RowBytes: 64, Page: PageMax, Clear: ^uint64(0)}}),
		appendBody(nil, 4, 5, []base.Fence{{Table: 1, Epoch: 1}}, []base.Segment{
			{Table: 1, RowBytes: RowBytesMax, Page: 1, Data: ^uint64(0), Rows: rows(64, RowBytesMax, 3)},
			{Table: 1, RowBytes: 8, Page: 2, Data: 0b11, Clear: 0b1100, Rows: rows(2, 8, 7)},
		}),
	}
}

// TestDecodeRoundTrips: every sample decodes to what encoded it, the view re-encodes to the same
// bytes, its rows alias the body, and its iterator starts over each time.
func TestDecodeRoundTrips(t *testing.T) {
	owner, seq, fences, segs := goldenBody()
	v, err := Decode(appendBody(nil, owner, seq, fences, segs))
	require.NoError(t, err)
	require.Equal(t, owner, v.Owner)
	require.Equal(t, seq, v.Seq)
	require.Equal(t, len(fences), v.FenceCount())
	for i := range fences {
		require.Equal(t, fences[i], v.Fence(i))
	}
	require.Equal(t, len(segs), v.SegmentCount())
	for pass := range 2 {
		it := v.Segments()
		for i := range segs {
			require.Equal(t, len(segs)-i, it.Len())
			var s base.Segment
			require.True(t, it.Next(&s))
			require.Equal(t, segs[i], s, "pass %d segment %d", pass, i)
		}
		require.False(t, it.Next(&base.Segment{}))
	}

	for i, body := range sampleBodies() {
		v, err := Decode(body)
		require.NoError(t, err, "sample %d", i)
		fs, ss := collect(&v)
		require.Equal(t, body, appendBody(nil, v.Owner, v.Seq, fs, ss), "sample %d re-encodes to itself", i)
		require.Equal(t, len(body), Size(len(fs), ss))
		// The rows alias the body: a change to the body shows in them.
		before := joinRows(ss)
		flip(body)
		require.Equal(t, flip(before), joinRows(ss), "sample %d: rows alias the body", i)
		flip(body)
	}
}

// Every strict prefix of a valid body, and the body with trailing bytes, is rejected as
// malformed (and so as corruption): Decode consumes a body exactly.
func TestDecodeRejectsPrefixesAndTrailing(t *testing.T) {
	for i, body := range sampleBodies() {
		for cut := range len(body) {
			_, err := Decode(body[:cut])
			require.ErrorIs(t, err, base.ErrMalformed, "sample %d cut at %d of %d", i, cut, len(body))
			require.ErrorIs(t, err, corrupt.ErrCorruption)
		}
		for _, extra := range []int{1, 8} {
			long := append(bytes.Clone(body), make([]byte, extra)...)
			require.ErrorIs(t, func() error { _, err := Decode(long); return err }(), base.ErrMalformed, "sample %d with %d trailing bytes", i, extra)
		}
	}
}

func TestDecodeRejectsBadFields(t *testing.T) {
	empty := appendBody(nil, 1, 2, nil, nil)
	put16 := func(b []byte, off int, v uint16) []byte { binary.LittleEndian.PutUint16(b[off:], v); return b }
	put32 := func(b []byte, off int, v uint32) []byte { binary.LittleEndian.PutUint32(b[off:], v); return b }
	put64 := func(b []byte, off int, v uint64) []byte { binary.LittleEndian.PutUint64(b[off:], v); return b }
	seg := func(s base.Segment) []byte { return appendBody(nil, 1, 2, nil, []base.Segment{s}) }
	const segAt = HeaderBytes // the first segment of a body without fences
	cases := []struct {
		name string
		body []byte
		is   error
	}{
		{"short header", empty[:HeaderBytes-1], base.ErrTruncated},
		{"counts", put32(put32(bytes.Clone(empty), 16, 1<<20), 20, 1<<20), base.ErrTruncated},
		{"fence count", put32(bytes.Clone(empty), 16, 1), base.ErrTruncated},
		{"seg count", put64(bytes.Clone(empty), 16, 1<<32), base.ErrTruncated},
		{"counts together", put32(put32(appendBody(nil, 1, 2, []base.Fence{{}, {}}, nil), 16, 1), 20, 1), base.ErrTruncated},
		{"fence reserved", put32(appendBody(nil, 1, 2, []base.Fence{{Table: 1, Epoch: 2}}, nil), HeaderBytes+4, 1), base.ErrMalformed},
		{"segment overlap", seg(base.Segment{RowBytes: 8, Data: 3, Clear: 2, Rows: rows(2, 8, 1)}), base.ErrMalformed},
		{"segment row size", seg(base.Segment{RowBytes: 9, Data: 1, Rows: rows(1, 9, 1)[:8]}), base.ErrBadRowSize},
		{"segment row size 0", seg(base.Segment{}), base.ErrBadRowSize},
		{"segment page", seg(base.Segment{RowBytes: 8, Page: PageMax + 1}), base.ErrMalformed},
		{"segment reserved", put16(seg(base.Segment{RowBytes: 8}), segAt+6, 1), base.ErrMalformed},
		{"segment short rows", seg(base.Segment{RowBytes: 8, Data: 3, Rows: rows(1, 8, 1)}), base.ErrTruncated},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Decode(c.body)
			require.ErrorIs(t, err, c.is)
			require.ErrorIs(t, err, base.ErrMalformed, "every decode failure is malformed")
			require.ErrorIs(t, err, corrupt.ErrCorruption)
		})
	}
}
