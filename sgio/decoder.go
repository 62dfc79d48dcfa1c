package sgio

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/weftdb/weft/commitbody"
)

// NewFrameReader returns a bufio.Reader over rd whose buffer holds one whole frame of up to
// bodyMax body bytes (clamped to MaxBodyLimit), for ReadFrame.
func NewFrameReader(rd io.Reader, bodyMax uint32) *bufio.Reader {
	if bodyMax > MaxBodyLimit {
		bodyMax = MaxBodyLimit
	}
	return bufio.NewReaderSize(rd, HeaderSize+int(bodyMax))
}

// ReadFrame reads the next frame from r without consuming it: it peeks the header, checks it
// (Decode) before waiting for the body, then peeks the whole frame. The Frame aliases r's
// buffer and is valid until the next read from r; the caller calls r.Discard(n) when done with
// it. r's buffer must hold HeaderSize+bodyMax bytes (NewFrameReader), else a frame that fits
// bodyMax but not the buffer fails with ErrFrameTooLarge.
//
// At a clean end of stream (no byte of a next frame) it returns io.EOF; a stream that ends
// inside a frame returns io.ErrUnexpectedEOF; other errors are Decode's or r's. Only one
// goroutine may read r at a time.
func ReadFrame(r *bufio.Reader, bodyMax uint32) (f Frame, n int, err error) {
	buf, err := r.Peek(HeaderSize)
	if err != nil {
		return Frame{}, 0, peekErr(buf, err)
	}
	f, n, err = Decode(buf, bodyMax)
	if err != ErrNeedMore {
		return f, n, err
	}
	if n > r.Size() {
		return Frame{}, 0, fmt.Errorf("sgio: frame of %d bytes exceeds the read buffer of %d: %w", n, r.Size(), ErrFrameTooLarge)
	}
	if buf, err = r.Peek(n); err != nil {
		return Frame{}, 0, peekErr(buf, err)
	}
	return Decode(buf, bodyMax)
}

func peekErr(buf []byte, err error) error {
	if errors.Is(err, io.EOF) {
		if len(buf) == 0 {
			return io.EOF
		}
		return io.ErrUnexpectedEOF
	}
	return err
}

// bodyReader decodes a body field by field with bounds checks. Its first failure sticks: later
// reads return zero values, so a parser reads every field and checks err once, at done.
type bodyReader struct {
	t   Type
	b   []byte
	off int
	err error
}

// fail records a format failure at offset off.
func (r *bodyReader) fail(off int, format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("sgio: %v body at offset %d: %s: %w", r.t, off, fmt.Sprintf(format, args...), ErrMalformed)
	}
}

// check records err, a rule failure of a parsed field, so that it also wraps ErrMalformed.
func (r *bodyReader) check(err error) {
	if err == nil || r.err != nil {
		return
	}
	if errors.Is(err, ErrMalformed) {
		r.err = fmt.Errorf("sgio: %v body at offset %d: %w", r.t, r.off, err)
	} else {
		r.err = fmt.Errorf("sgio: %v body at offset %d: %w: %w", r.t, r.off, err, ErrMalformed)
	}
}

// truncated records that n bytes were wanted beyond the body's end.
func (r *bodyReader) truncated(n int) {
	r.err = fmt.Errorf("sgio: %v body of %d bytes: %d bytes wanted at offset %d: %w", r.t, len(r.b), n, r.off, ErrTruncated)
}

// take returns the next n bytes (aliasing the body), or nil after a failure.
func (r *bodyReader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b)-r.off {
		r.truncated(n)
		return nil
	}
	s := r.b[r.off : r.off+n : r.off+n]
	r.off += n
	return s
}

func (r *bodyReader) u8() uint8 {
	if b := r.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (r *bodyReader) u16() uint16 {
	if b := r.take(2); b != nil {
		return binary.LittleEndian.Uint16(b)
	}
	return 0
}

func (r *bodyReader) u32() uint32 {
	if b := r.take(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (r *bodyReader) u64() uint64 {
	if b := r.take(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

func (r *bodyReader) bytes32() (a [32]byte) {
	if b := r.take(32); b != nil {
		copy(a[:], b)
	}
	return a
}

func (r *bodyReader) reserved8() {
	if off := r.off; r.u8() != 0 {
		r.fail(off, "reserved field not zero")
	}
}

func (r *bodyReader) reserved16() {
	if off := r.off; r.u16() != 0 {
		r.fail(off, "reserved field not zero")
	}
}

func (r *bodyReader) reserved32() {
	if off := r.off; r.u32() != 0 {
		r.fail(off, "reserved field not zero")
	}
}

// count reads a u32 element count and checks it against the bytes left, at least elemMin
// each, before anything is allocated for the elements.
func (r *bodyReader) count(elemMin int) int {
	off := r.off
	n := r.u32()
	if r.err != nil {
		return 0
	}
	if left := len(r.b) - r.off; uint64(n)*uint64(elemMin) > uint64(left) {
		r.err = fmt.Errorf("sgio: %v body at offset %d: count %d of elements of at least %d bytes, %d bytes left: %w",
			r.t, off, n, elemMin, left, ErrTruncated)
		return 0
	}
	return int(n)
}

// str reads a u16-length-prefixed string of at most maxLen bytes; it copies.
func (r *bodyReader) str(maxLen int) string {
	off := r.off
	n := int(r.u16())
	if r.err == nil && n > maxLen {
		r.fail(off, "string of %d bytes, limit %d", n, maxLen)
	}
	return string(r.take(n))
}

// name reads a string that must pass CheckName.
func (r *bodyReader) name() string {
	s := r.str(NameMax)
	if r.err == nil {
		r.check(CheckName(s))
	}
	return s
}

// align skips the zero padding up to the next multiple of BodyAlign.
func (r *bodyReader) align() {
	off := r.off
	for _, c := range r.take(pad8(r.off) - r.off) {
		if c != 0 {
			r.fail(off, "padding not zero")
			return
		}
	}
}

// done checks the body's end: zero padding to a multiple of BodyAlign and nothing after it.
func (r *bodyReader) done() error {
	r.align()
	if r.err == nil && r.off != len(r.b) {
		r.fail(r.off, "%d trailing bytes", len(r.b)-r.off)
	}
	return r.err
}

// SegmentIter walks the segments of a body that ViewSegments or ViewCommit checked, without
// allocating: commitbody's iterator, the one decoder of segments.
type SegmentIter = commitbody.SegmentIter

// ViewSegments validates a Segments body, as Segments.Parse does, and returns an iterator over
// its segments. It allocates nothing (except on failure); the segments alias body.
func ViewSegments(body []byte) (SegmentIter, error) {
	r := bodyReader{t: TypeSegments, b: body}
	n := r.count(SegmentHeaderSize)
	r.reserved32()
	if r.err != nil {
		return SegmentIter{}, r.err
	}
	it, end, err := commitbody.WalkSegments(body, r.off, n)
	if err != nil {
		r.check(err)
		return SegmentIter{}, r.err
	}
	r.off = end
	if err := r.done(); err != nil {
		return SegmentIter{}, err
	}
	return it, nil
}

// CommitView is a validated, allocation-free view of a Commit body: commitbody's, which the
// storage engine decodes its WAL commit records with. Its fences and segments alias the body:
// valid until the frame's buffer is discarded.
type CommitView = commitbody.View

// ViewCommit validates a Commit body, as Commit.Parse does, and returns a view of it
// (commitbody.Decode). It allocates nothing (except on failure).
func ViewCommit(body []byte) (CommitView, error) { return commitbody.Decode(body) }
