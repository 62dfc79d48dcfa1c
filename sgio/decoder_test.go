package sgio

import (
	"bufio"
	"bytes"
	"io"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
)

// oneByteReader returns at most one byte per Read, to exercise partial reads.
type oneByteReader struct{ r io.Reader }

func (o oneByteReader) Read(p []byte) (int, error) {
	if len(p) > 1 {
		p = p[:1]
	}
	return o.r.Read(p)
}

func TestReadFrameStream(t *testing.T) {
	var stream []byte
	msgs := sampleMessages()
	for i, m := range msgs {
		stream = AppendFrame(stream, uint64(i), m)
	}
	for _, name := range []string{"whole", "bytewise"} {
		t.Run(name, func(t *testing.T) {
			var rd io.Reader = bytes.NewReader(stream)
			if name == "bytewise" {
				rd = oneByteReader{rd}
			}
			br := NewFrameReader(rd, 64<<10)
			for i, m := range msgs {
				f, n, err := ReadFrame(br, 64<<10)
				require.NoError(t, err)
				require.Equal(t, uint64(i), f.ID)
				require.Equal(t, m.Type(), f.Type)
				if len(f.Body) > 0 {
					// Whole frames from an aligned buffer keep every body 8-aligned.
					require.Zero(t, uintptr(unsafe.Pointer(&f.Body[0]))%8, "body of frame %d", i)
				}
				got := NewMessage(f.Type)
				require.NoError(t, got.Parse(f.Body))
				require.Equal(t, m, got)
				_, err = br.Discard(n)
				require.NoError(t, err)
			}
			_, _, err := ReadFrame(br, 64<<10)
			require.ErrorIs(t, err, io.EOF)
		})
	}
}

func TestReadFrameErrors(t *testing.T) {
	frame := AppendFrame(nil, 1, &Commit{Owner: 1, Seq: 2, Segments: []base.Segment{{Table: 1, RowBytes: 64, Data: 0xff, Rows: rows(8, 64, 1)}}})

	// A stream that ends inside a frame, in the header or in the body.
	for _, cut := range []int{1, HeaderSize - 1, HeaderSize, len(frame) - 1} {
		_, _, err := ReadFrame(NewFrameReader(bytes.NewReader(frame[:cut]), 1<<20), 1<<20)
		require.ErrorIs(t, err, io.ErrUnexpectedEOF, "cut %d", cut)
	}
	// Over the limit: rejected from the header, before the body is read.
	br := NewFrameReader(io.MultiReader(bytes.NewReader(frame[:HeaderSize]), failReader{}), 1<<20)
	_, _, err := ReadFrame(br, 64)
	require.ErrorIs(t, err, ErrFrameTooLarge)
	// Within the limit but beyond the reader's buffer.
	br = bufio.NewReaderSize(bytes.NewReader(frame), 64)
	_, _, err = ReadFrame(br, 1<<20)
	require.ErrorIs(t, err, ErrFrameTooLarge)
	// The reader's own errors pass through.
	_, _, err = ReadFrame(NewFrameReader(failReader{}, 64), 64)
	require.ErrorIs(t, err, errFail)
}

var errFail = io.ErrClosedPipe

type failReader struct{}

func (failReader) Read([]byte) (int, error) { return 0, errFail }

func TestViewCommitMatchesParse(t *testing.T) {
	for _, m := range sampleMessages() {
		c, ok := m.(*Commit)
		if !ok {
			continue
		}
		body := c.AppendBody(nil)
		v, err := ViewCommit(body)
		require.NoError(t, err)
		require.Equal(t, c.Owner, v.Owner)
		require.Equal(t, c.Seq, v.Seq)
		require.Equal(t, len(c.Fences), v.FenceCount())
		for i := range c.Fences {
			require.Equal(t, c.Fences[i], v.Fence(i))
		}
		require.Equal(t, len(c.Segments), v.SegmentCount())
		for pass := range 2 { // Segments starts over each time
			it := v.Segments()
			for i := range c.Segments {
				require.Equal(t, len(c.Segments)-i, it.Len())
				var s base.Segment
				require.True(t, it.Next(&s))
				require.Equal(t, c.Segments[i], s, "pass %d segment %d", pass, i)
				if len(s.Rows) > 0 {
					require.True(t, aliases(body, s.Rows), "rows alias the body")
				}
			}
			require.False(t, it.Next(&base.Segment{}))
		}
		for cut := range len(body) {
			_, err := ViewCommit(body[:cut])
			require.ErrorIs(t, err, ErrMalformed)
		}
	}
}

func TestViewSegmentsMatchesParse(t *testing.T) {
	for _, m := range sampleMessages() {
		s, ok := m.(*Segments)
		if !ok {
			continue
		}
		body := s.AppendBody(nil)
		it, err := ViewSegments(body)
		require.NoError(t, err)
		for i := range s.Segments {
			var got base.Segment
			require.True(t, it.Next(&got))
			require.Equal(t, s.Segments[i], got)
		}
		require.False(t, it.Next(&base.Segment{}))
		for cut := range len(body) {
			_, err := ViewSegments(body[:cut])
			require.ErrorIs(t, err, ErrMalformed)
		}
	}
	var zero SegmentIter
	require.False(t, zero.Next(&base.Segment{}))
}

// aliases reports whether sub lies inside buf's memory.
func aliases(buf, sub []byte) bool {
	if len(sub) == 0 || len(buf) == 0 {
		return false
	}
	b := uintptr(unsafe.Pointer(&buf[0]))
	s := uintptr(unsafe.Pointer(&sub[0]))
	return s >= b && s+uintptr(len(sub)) <= b+uintptr(len(buf))
}
