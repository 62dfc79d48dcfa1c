package sgio

import (
	"encoding/binary"
	"io"
	"net"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/commitbody"
	"github.com/weftdb/weft/internal/assert"
	"github.com/weftdb/weft/internal/checksum"
)

// Writer gathers frames into one net.Buffers, for one writev of many frames: the "gather"
// half of sparse scatter-gather IO.
//
// Headers and fixed fields go into a scratch arena that the Writer reuses after Reset; the row
// bytes of Commit and Segments messages (Segment.Rows, or the Runs gather lists) are appended
// by reference, so a batch of many rows costs one writev and no copy of its row runs. Runs
// shorter than CopyBelow are the exception: they are copied, because an iovec per 64-byte row
// costs more than the copy. The CRC is computed over the gathered slices when each frame is
// complete.
//
// The rule that makes this safe: row bytes appended by reference must not change until the
// write of the frame has completed (WriteTo returned, or a gnet AsyncWritev's callback ran).
// A change before the CRC is computed goes out as sent; a change after it is caught by the
// receiver's CRC check, which rejects the frame. Weft's commit pipeline gives each batch its
// own buffer and leaves it alone until the batch is acknowledged or failed.
//
// After warm-up (once the arena and the slice of buffers have grown to the batch sizes in use)
// appending and resetting allocate nothing. The zero Writer is ready to use. A Writer is not
// safe for concurrent use.
type Writer struct {
	vec    [][]byte    // gathered slices, in order
	out    net.Buffers // what WriteTo hands to the socket: vec, consumed as it is written
	flat   []byte      // WriteTo's flattening buffer for writers without writev
	chunks [][]byte    // the scratch arena; chunks never move, so vec may alias them
	chunk  int         // index of the chunk in use
	cur    []byte      // chunks[chunk], or nil before the first scratch since Reset
	used   int         // bytes used of cur
	merge  bool        // vec's last slice ends at cur[used]: scratch may extend it
	size   int64       // bytes gathered
	frames int         // frames gathered

	// CopyBelow is the length under which a row slice is copied into the arena instead of
	// gathered by reference: a writev entry and a separate checksum call cost more than
	// copying a few rows (docs/wire.md, Measured). 0 means DefaultCopyBelow; -1 gathers
	// every row slice by reference.
	CopyBelow int
}

// DefaultCopyBelow is the CopyBelow of a Writer that does not set it.
const DefaultCopyBelow = 256

func (w *Writer) copyBelow() int {
	if w.CopyBelow == 0 {
		return DefaultCopyBelow
	}
	return w.CopyBelow
}

const (
	// writerChunkBytes is the size of a scratch chunk; a larger fixed part gets its own chunk.
	writerChunkBytes = 16 << 10
	// flatKeepBytes bounds the flattening buffer kept between WriteTo calls.
	flatKeepBytes = 1 << 20
)

// scratch reserves n bytes of the arena, appends them to the gather list and returns them for
// the caller to fill before the frame's CRC covers them.
func (w *Writer) scratch(n int) []byte {
	if n > len(w.cur)-w.used {
		w.nextChunk(n)
	}
	b := w.cur[w.used : w.used+n : w.used+n]
	if w.merge {
		last := len(w.vec) - 1
		w.vec[last] = w.vec[last][:len(w.vec[last])+n]
	} else {
		w.vec = append(w.vec, w.cur[w.used:w.used+n])
	}
	w.used += n
	w.merge = true
	w.size += int64(n)
	return b
}

// nextChunk moves to the next arena chunk, making one that holds at least n bytes if needed.
// Chunks are never resized while in use: vec aliases them.
func (w *Writer) nextChunk(n int) {
	if w.cur != nil {
		w.chunk++
	}
	if w.chunk == len(w.chunks) {
		w.chunks = append(w.chunks, make([]byte, max(writerChunkBytes, n)))
	} else if len(w.chunks[w.chunk]) < n {
		w.chunks[w.chunk] = make([]byte, n) // an unusually large fixed part; rare
	}
	w.cur = w.chunks[w.chunk]
	w.used = 0
	w.merge = false
}

// ref appends b to the gather list by reference.
func (w *Writer) ref(b []byte) {
	if len(b) == 0 {
		return
	}
	w.vec = append(w.vec, b)
	w.merge = false
	w.size += int64(len(b))
}

// Append gathers one frame holding m with request id id. Rows of a *Commit or *Segments
// (Segment.Rows, or Runs) are gathered by reference, except slices shorter than CopyBelow,
// which are copied; every other field is copied into the arena. m must be valid
// (m.Validate() == nil); Append panics if m's encoding disagrees with its BodySize, or the body
// exceeds MaxBodyLimit.
func (w *Writer) Append(id uint64, m Message) {
	size := m.BodySize()
	if size > MaxBodyLimit || size%BodyAlign != 0 {
		assert.Failf("sgio: %v body of %d bytes", m.Type(), size)
	}
	before := w.size
	hdr := w.scratch(HeaderSize)
	first := len(w.vec) - 1 // the slice that holds the header
	bodyOff := len(w.vec[first])
	putHeader(hdr, m.Type(), id, size)
	switch m := m.(type) {
	case *Commit:
		m.appendFixed(w.scratch(commitbody.HeaderBytes + commitbody.FenceBytes*len(m.Fences))[:0])
		w.gatherSegments(m.Segments, m.Runs)
	case *Segments:
		fixed := w.scratch(8)
		binary.LittleEndian.PutUint32(fixed, uint32(len(m.Segments)))
		binary.LittleEndian.PutUint32(fixed[4:], 0)
		w.gatherSegments(m.Segments, m.Runs)
	default:
		body := w.scratch(size)
		checkBodySize(m, size, len(m.AppendBody(body[:0])))
	}
	checkBodySize(m, size, int(w.size-before)-HeaderSize)
	// The CRC runs over the gathered slices once the frame is complete, so that fixed fields
	// and copied rows coalesced into one scratch slice cost one checksum call.
	crc := checksum.Update(headerCRC(hdr), w.vec[first][bodyOff:])
	for _, b := range w.vec[first+1:] {
		crc = checksum.Update(crc, b)
	}
	binary.LittleEndian.PutUint32(hdr[offCRC:], crc)
	w.frames++
}

// gatherSegments gathers segment headers into the arena and rows by reference (or copied,
// when shorter than CopyBelow).
func (w *Writer) gatherSegments(segs []base.Segment, runs [][][]byte) {
	for i := range segs {
		s := &segs[i]
		if runs == nil {
			if len(s.Rows) != s.RowsSize() {
				assert.Failf("sgio: segment %d: %d row bytes, want %d", i, len(s.Rows), s.RowsSize())
			}
			if len(s.Rows) < w.copyBelow() { // header and rows in one piece
				b := w.scratch(SegmentHeaderSize + len(s.Rows))
				commitbody.PutSegmentHeader(b, s)
				copy(b[SegmentHeaderSize:], s.Rows)
				continue
			}
			commitbody.PutSegmentHeader(w.scratch(SegmentHeaderSize), s)
			w.ref(s.Rows)
			continue
		}
		commitbody.PutSegmentHeader(w.scratch(SegmentHeaderSize), s)
		n := 0
		for _, r := range runs[i] {
			w.rows(r)
			n += len(r)
		}
		if n != s.RowsSize() {
			assert.Failf("sgio: segment %d: %d row bytes in runs, want %d", i, n, s.RowsSize())
		}
	}
}

// rows gathers row bytes: by reference, or copied into the arena when short.
func (w *Writer) rows(b []byte) {
	if len(b) < w.copyBelow() {
		copy(w.scratch(len(b)), b)
		return
	}
	w.ref(b)
}

// checkBodySize asserts that an encoding produced the size BodySize promised.
func checkBodySize(m Message, want, got int) {
	if got != want {
		assert.Failf("sgio: %v encoded %d body bytes, BodySize says %d", m.Type(), got, want)
	}
}

// Buffers reports the gathered slices, for a gnet AsyncWritev or a custom write. They stay
// valid, and the referenced rows must stay unchanged, until the write completes; call Reset
// only after that. The caller must not modify the returned slice of slices.
func (w *Writer) Buffers() [][]byte { return w.vec }

// Len reports the number of bytes gathered since the last Reset.
func (w *Writer) Len() int64 { return w.size }

// Frames reports the number of frames gathered since the last Reset.
func (w *Writer) Frames() int { return w.frames }

// Reset forgets the gathered frames and recycles the arena. The slices Buffers returned become
// invalid.
func (w *Writer) Reset() {
	clear(w.vec) // drop references to the callers' rows
	w.vec = w.vec[:0]
	w.chunk, w.cur, w.used, w.merge = 0, nil, 0, false
	w.size, w.frames = 0, 0
}

// WriteTo writes every gathered frame to dst and then Resets, even on error. To a
// *net.TCPConn or *net.UnixConn it is one writev through net.Buffers (Go splits it at 1024
// slices and continues after a partial write); to any other writer (a tls.Conn, a wrapped
// conn) it is one Write of a flattened copy, since net.Buffers would call Write once per slice.
func (w *Writer) WriteTo(dst io.Writer) (int64, error) {
	defer w.Reset()
	if len(w.vec) == 0 {
		return 0, nil
	}
	switch dst.(type) {
	case *net.TCPConn, *net.UnixConn:
		w.out = w.vec
		n, err := w.out.WriteTo(dst)
		w.out = nil
		return n, err
	}
	w.flat = w.flat[:0]
	for _, b := range w.vec {
		w.flat = append(w.flat, b...)
	}
	n, err := dst.Write(w.flat)
	if cap(w.flat) > flatKeepBytes {
		w.flat = nil
	}
	return int64(n), err
}
