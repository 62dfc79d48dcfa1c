package sgio

import (
	"encoding/binary"
	"fmt"
	"math/bits"

	"github.com/weftdb/weft/base"
)

// A segment (base.Segment) on the wire:
//
//	off size field
//	0   4    table id
//	4   2    row bytes (RowBytesMin..RowBytesMax, a multiple of 8)
//	6   2    reserved, 0
//	8   8    page number (<= PageMax)
//	16  8    data mask
//	24  8    clear mask (data & clear == 0)
//	32  ...  popcount(data) * row bytes: the rows of the data mask, in slot order

// SegmentSize reports the segment's encoded size: header and rows.
func SegmentSize(s *base.Segment) int { return SegmentHeaderSize + s.RowsSize() }

// checkSegmentHeader checks the rules of a segment's header fields.
func checkSegmentHeader(s *base.Segment) error {
	if !segmentHeaderOK(s) {
		return segmentHeaderError(s)
	}
	return nil
}

// segmentHeaderOK is checkSegmentHeader's test, small enough to inline into the decoders' loops.
func segmentHeaderOK(s *base.Segment) bool {
	return s.RowBytes-RowBytesMin <= RowBytesMax-RowBytesMin && s.RowBytes&7 == 0 && s.Page <= PageMax && s.Data&s.Clear == 0
}

func segmentHeaderError(s *base.Segment) error {
	if err := CheckRowBytes(int(s.RowBytes)); err != nil {
		return err
	}
	if s.Page > PageMax {
		return fmt.Errorf("sgio: segment of table %d: page %d beyond the last page %d: %w", s.Table, s.Page, uint64(PageMax), ErrMalformed)
	}
	both := s.Data & s.Clear
	return fmt.Errorf("sgio: segment of table %d page %d: data mask %#016x and clear mask %#016x share slots %#016x: %w",
		s.Table, s.Page, s.Data, s.Clear, both, ErrMalformed)
}

// Validate reports whether s may be encoded: its header rules, and Rows of RowsSize bytes.
// Its errors wrap ErrBadRowSize or ErrMalformed.
func ValidateSegment(s *base.Segment) error { return validateSegment(s, len(s.Rows)) }

// validate checks the header rules and a row byte count of rowsLen.
func validateSegment(s *base.Segment, rowsLen int) error {
	if err := checkSegmentHeader(s); err != nil {
		return err
	}
	if want := s.RowsSize(); rowsLen != want {
		return fmt.Errorf("sgio: segment of table %d page %d: %d row bytes for %d rows of %d bytes, want %d: %w",
			s.Table, s.Page, rowsLen, bits.OnesCount64(s.Data), s.RowBytes, want, ErrBadRowSize)
	}
	return nil
}

// putSegmentHeader writes s's header into b[:SegmentHeaderSize].
func putSegmentHeader(b []byte, s *base.Segment) {
	_ = b[SegmentHeaderSize-1]
	binary.LittleEndian.PutUint32(b[0:], s.Table)
	binary.LittleEndian.PutUint16(b[4:], s.RowBytes)
	binary.LittleEndian.PutUint16(b[6:], 0)
	binary.LittleEndian.PutUint64(b[8:], s.Page)
	binary.LittleEndian.PutUint64(b[16:], s.Data)
	binary.LittleEndian.PutUint64(b[24:], s.Clear)
}

// AppendSegmentHeader appends the header of a segment of table's page with the given row size
// and masks (the rows follow it: popcount(data)*rowBytes bytes) and returns the extended
// slice. It is the one encoder of the header, for the wire and for the storage node's WAL,
// whose commit records carry Commit bodies; it checks nothing (Validate does).
func AppendSegmentHeader(dst []byte, table uint32, rowBytes int, page, data, clear uint64) []byte {
	dst = le32(dst, table)
	dst = append(dst, byte(rowBytes), byte(rowBytes>>8), 0, 0)
	dst = le64(dst, page)
	dst = le64(dst, data)
	return le64(dst, clear)
}

// AppendSegment appends s, header and rows (copied), to dst and returns the extended slice.
func AppendSegment(dst []byte, s *base.Segment) []byte {
	var h [SegmentHeaderSize]byte
	putSegmentHeader(h[:], s)
	return append(append(dst, h[:]...), s.Rows...)
}

// parseSegment decodes one segment at r's offset; Rows aliases r's body.
func parseSegment(r *bodyReader, s *base.Segment) {
	if r.err != nil {
		return
	}
	off := r.off
	if len(r.b)-off < SegmentHeaderSize {
		r.truncated(SegmentHeaderSize)
		return
	}
	h := r.b[off : off+SegmentHeaderSize : off+SegmentHeaderSize]
	s.Table = binary.LittleEndian.Uint32(h[0:])
	s.RowBytes = binary.LittleEndian.Uint16(h[4:])
	s.Page = binary.LittleEndian.Uint64(h[8:])
	s.Data = binary.LittleEndian.Uint64(h[16:])
	s.Clear = binary.LittleEndian.Uint64(h[24:])
	if binary.LittleEndian.Uint16(h[6:]) != 0 {
		r.fail(off+6, "segment reserved field not zero")
		return
	}
	if !segmentHeaderOK(s) {
		r.check(segmentHeaderError(s))
		return
	}
	r.off = off + SegmentHeaderSize
	s.Rows = r.take(s.RowsSize())
}

// validateSegments checks segs, with optional per-segment runs.
func validateSegments(segs []base.Segment, runs [][][]byte) error {
	if runs != nil && len(runs) != len(segs) {
		return fmt.Errorf("sgio: %d segments but %d row-run lists: %w", len(segs), len(runs), ErrMalformed)
	}
	for i := range segs {
		n := len(segs[i].Rows)
		if runs != nil {
			n = runsSize(runs[i])
		}
		if err := validateSegment(&segs[i], n); err != nil {
			return fmt.Errorf("sgio: segment %d: %w", i, err)
		}
	}
	return nil
}

func runsSize(runs [][]byte) int {
	n := 0
	for _, r := range runs {
		n += len(r)
	}
	return n
}

func segmentsSize(segs []base.Segment) int {
	n := 0
	for i := range segs {
		n += SegmentSize(&segs[i])
	}
	return n
}

// appendSegmentsCopy appends segs, copying rows from Rows or from runs.
func appendSegmentsCopy(dst []byte, segs []base.Segment, runs [][][]byte) []byte {
	for i := range segs {
		if runs == nil {
			dst = AppendSegment(dst, &segs[i])
			continue
		}
		var h [SegmentHeaderSize]byte
		putSegmentHeader(h[:], &segs[i])
		dst = append(dst, h[:]...)
		for _, r := range runs[i] {
			dst = append(dst, r...)
		}
	}
	return dst
}

// pageWantSize is the encoded size of a PageWant: table u32, reserved u32, page, want.
const pageWantSize = 24

// ReadPages asks for rows: for each PageWant, the server answers with one Segment (in the same
// order) whose Data is Want&present and whose Clear is Want&^present.
type ReadPages struct {
	Wants []base.PageWant
}

// Type reports TypeReadPages.
func (*ReadPages) Type() Type { return TypeReadPages }

// BodySize reports the encoded body length.
func (m *ReadPages) BodySize() int { return 8 + pageWantSize*len(m.Wants) }

// AppendBody appends the encoded body.
func (m *ReadPages) AppendBody(dst []byte) []byte {
	dst = le32(dst, uint32(len(m.Wants)))
	dst = le32(dst, 0)
	for _, w := range m.Wants {
		dst = le32(dst, w.Table)
		dst = le32(dst, 0)
		dst = le64(dst, w.Page)
		dst = le64(dst, w.Want)
	}
	return dst
}

// Parse decodes body.
func (m *ReadPages) Parse(body []byte) error {
	r := bodyReader{t: TypeReadPages, b: body}
	n := r.count(pageWantSize)
	r.reserved32()
	m.Wants = m.Wants[:0]
	for i := 0; i < n && r.err == nil; i++ {
		var w base.PageWant
		w.Table = r.u32()
		r.reserved32()
		w.Page = r.u64()
		w.Want = r.u64()
		if w.Page > PageMax && r.err == nil {
			r.fail(r.off-16, "page %d beyond the last page", w.Page)
		}
		m.Wants = append(m.Wants, w)
	}
	return r.done()
}

// Validate checks the page numbers.
func (m *ReadPages) Validate() error {
	for i, w := range m.Wants {
		if w.Page > PageMax {
			return fmt.Errorf("sgio: ReadPages entry %d: page %d beyond the last page: %w", i, w.Page, ErrMalformed)
		}
	}
	return nil
}

// Segments answers ReadPages, and carries pages of rows in general.
//
// Body: count u32, reserved u32, then count segments.
type Segments struct {
	Segments []base.Segment
	// Runs, when not nil, gives segment i's rows as Runs[i], a gather list of row runs (for
	// example from a page frame), and Segments[i].Rows is ignored. Only for encoding: Parse
	// sets it to nil.
	Runs [][][]byte
}

// Type reports TypeSegments.
func (*Segments) Type() Type { return TypeSegments }

// BodySize reports the encoded body length.
func (m *Segments) BodySize() int { return 8 + segmentsSize(m.Segments) }

// AppendBody appends the encoded body, copying the rows.
func (m *Segments) AppendBody(dst []byte) []byte {
	dst = le32(dst, uint32(len(m.Segments)))
	dst = le32(dst, 0)
	return appendSegmentsCopy(dst, m.Segments, m.Runs)
}

// Parse decodes body. The segments' Rows alias body. To walk a body without filling a slice,
// use ViewSegments.
func (m *Segments) Parse(body []byte) error {
	r := bodyReader{t: TypeSegments, b: body}
	n := r.count(SegmentHeaderSize)
	r.reserved32()
	m.Segments = m.Segments[:0]
	m.Runs = nil
	for i := 0; i < n && r.err == nil; i++ {
		var s base.Segment
		parseSegment(&r, &s)
		m.Segments = append(m.Segments, s)
	}
	return r.done()
}

// Validate checks every segment.
func (m *Segments) Validate() error { return validateSegments(m.Segments, m.Runs) }

// fenceSize is the encoded size of a Fence: table u32, reserved u32, epoch.
const fenceSize = 16

// commitFixed is the size of a Commit body before its fences: owner, seq, two counts.
const commitFixed = 24

// Commit is a commit batch: the segments of one or more transactions of one owner, applied
// atomically, with the owner's seq and one Fence per table the segments touch.
//
// Body:
//
//	off size field
//	0   8    owner id
//	8   8    seq
//	16  4    fence count
//	20  4    segment count
//	24  16*n fences {table u32, reserved u32, epoch u64}
//	... segments (Segment), back to back
type Commit struct {
	Owner    uint64
	Seq      uint64
	Fences   []base.Fence
	Segments []base.Segment
	// Runs, when not nil, gives segment i's rows as Runs[i], a gather list of row runs, and
	// Segments[i].Rows is ignored. Only for encoding: Parse sets it to nil.
	Runs [][][]byte
}

// Type reports TypeCommit.
func (*Commit) Type() Type { return TypeCommit }

// BodySize reports the encoded body length.
func (m *Commit) BodySize() int {
	return commitFixed + fenceSize*len(m.Fences) + segmentsSize(m.Segments)
}

func (m *Commit) appendFixed(dst []byte) []byte {
	dst = AppendCommitHeader(dst, m.Owner, m.Seq, len(m.Fences), len(m.Segments))
	for _, f := range m.Fences {
		dst = AppendFence(dst, f.Table, f.Epoch)
	}
	return dst
}

// AppendCommitHeader appends the fixed fields of a Commit body (owner, seq, the fence and
// segment counts) and returns the extended slice; the fences (AppendFence) and the segments
// (AppendSegmentHeader and the rows) follow. Commit.AppendBody and the storage node's WAL
// encode with it.
func AppendCommitHeader(dst []byte, owner, seq uint64, fences, segments int) []byte {
	dst = le64(dst, owner)
	dst = le64(dst, seq)
	dst = le32(dst, uint32(fences))
	return le32(dst, uint32(segments))
}

// AppendFence appends one fence of a Commit body and returns the extended slice.
func AppendFence(dst []byte, table uint32, epoch uint64) []byte {
	dst = le32(dst, table)
	dst = le32(dst, 0)
	return le64(dst, epoch)
}

// AppendBody appends the encoded body, copying the rows.
func (m *Commit) AppendBody(dst []byte) []byte {
	return appendSegmentsCopy(m.appendFixed(dst), m.Segments, m.Runs)
}

// Parse decodes body. The segments' Rows alias body. To walk a body without filling slices,
// use ViewCommit.
func (m *Commit) Parse(body []byte) error {
	r := bodyReader{t: TypeCommit, b: body}
	m.Owner = r.u64()
	m.Seq = r.u64()
	nf := r.count(fenceSize)
	ns := r.count(SegmentHeaderSize)
	m.Fences = m.Fences[:0]
	m.Segments = m.Segments[:0]
	m.Runs = nil
	if r.err == nil && uint64(nf)*fenceSize+uint64(ns)*SegmentHeaderSize > uint64(len(body)-r.off) {
		r.fail(r.off, "%d fences and %d segments do not fit in %d bytes", nf, ns, len(body)-r.off)
	}
	for i := 0; i < nf && r.err == nil; i++ {
		var f base.Fence
		f.Table = r.u32()
		r.reserved32()
		f.Epoch = r.u64()
		m.Fences = append(m.Fences, f)
	}
	for i := 0; i < ns && r.err == nil; i++ {
		var s base.Segment
		parseSegment(&r, &s)
		m.Segments = append(m.Segments, s)
	}
	return r.done()
}

// Validate checks every segment.
func (m *Commit) Validate() error { return validateSegments(m.Segments, m.Runs) }

// PageDir asks which pages of [Lo, Hi) of a table hold rows, at most MaxEntries of them.
type PageDir struct {
	Table      uint32
	MaxEntries uint32
	Lo         uint64
	Hi         uint64
}

// Type reports TypePageDir.
func (*PageDir) Type() Type { return TypePageDir }

// BodySize reports the encoded body length.
func (*PageDir) BodySize() int { return 24 }

// AppendBody appends the encoded body.
func (m *PageDir) AppendBody(dst []byte) []byte {
	dst = le32(dst, m.Table)
	dst = le32(dst, m.MaxEntries)
	dst = le64(dst, m.Lo)
	return le64(dst, m.Hi)
}

// Parse decodes body.
func (m *PageDir) Parse(body []byte) error {
	r := bodyReader{t: TypePageDir, b: body}
	m.Table = r.u32()
	m.MaxEntries = r.u32()
	m.Lo = r.u64()
	m.Hi = r.u64()
	return r.done()
}

// Validate accepts every PageDir; the server judges the range.
func (*PageDir) Validate() error { return nil }

// PageEntry is one page of a PageDirReply and the mask of its present rows.
type PageEntry struct {
	Page    uint64
	Present uint64
}

// PageDirReply answers PageDir: the pages that hold rows, in ascending order, and the cursor
// to resume from (Next == the request's Hi when the range is done).
type PageDirReply struct {
	Next    uint64
	Entries []PageEntry
}

// Type reports TypePageDirReply.
func (*PageDirReply) Type() Type { return TypePageDirReply }

// BodySize reports the encoded body length.
func (m *PageDirReply) BodySize() int { return 16 + 16*len(m.Entries) }

// AppendBody appends the encoded body.
func (m *PageDirReply) AppendBody(dst []byte) []byte {
	dst = le64(dst, m.Next)
	dst = le32(dst, uint32(len(m.Entries)))
	dst = le32(dst, 0)
	for _, e := range m.Entries {
		dst = le64(le64(dst, e.Page), e.Present)
	}
	return dst
}

// Parse decodes body.
func (m *PageDirReply) Parse(body []byte) error {
	r := bodyReader{t: TypePageDirReply, b: body}
	m.Next = r.u64()
	n := r.count(16)
	r.reserved32()
	m.Entries = m.Entries[:0]
	for i := 0; i < n && r.err == nil; i++ {
		m.Entries = append(m.Entries, PageEntry{Page: r.u64(), Present: r.u64()})
	}
	return r.done()
}

// Validate accepts every PageDirReply.
func (*PageDirReply) Validate() error { return nil }

// CommitAck answers Commit: the batch is in the WAL (synced per the sync mode) at LSN.
type CommitAck struct {
	LSN uint64
	Seq uint64
}

// Type reports TypeCommitAck.
func (*CommitAck) Type() Type { return TypeCommitAck }

// BodySize reports the encoded body length.
func (*CommitAck) BodySize() int { return 16 }

// AppendBody appends the encoded body.
func (m *CommitAck) AppendBody(dst []byte) []byte { return le64(le64(dst, m.LSN), m.Seq) }

// Parse decodes body.
func (m *CommitAck) Parse(body []byte) error {
	r := bodyReader{t: TypeCommitAck, b: body}
	m.LSN = r.u64()
	m.Seq = r.u64()
	return r.done()
}

// Validate accepts every CommitAck.
func (*CommitAck) Validate() error { return nil }
