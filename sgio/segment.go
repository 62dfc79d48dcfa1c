package sgio

import (
	"fmt"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/commitbody"
)

// A segment (base.Segment) on the wire is commitbody's (its package doc has the layout): its
// encoders, its rules and its decoder (commitbody.WalkSegments) serve the Segments reply here
// and the Commit body (commitbody.Decode).

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
		if err := commitbody.ValidateSegmentRows(&segs[i], n); err != nil {
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

// appendSegmentsCopy appends segs, copying rows from Rows or from runs.
func appendSegmentsCopy(dst []byte, segs []base.Segment, runs [][][]byte) []byte {
	for i := range segs {
		if runs == nil {
			dst = commitbody.AppendSegment(dst, &segs[i])
			continue
		}
		var h [SegmentHeaderSize]byte
		commitbody.PutSegmentHeader(h[:], &segs[i])
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
func (m *Segments) BodySize() int { return 8 + commitbody.SegmentsSize(m.Segments) }

// AppendBody appends the encoded body, copying the rows.
func (m *Segments) AppendBody(dst []byte) []byte {
	dst = le32(dst, uint32(len(m.Segments)))
	dst = le32(dst, 0)
	return appendSegmentsCopy(dst, m.Segments, m.Runs)
}

// Parse decodes body. The segments' Rows alias body. To walk a body without filling a slice,
// use ViewSegments.
func (m *Segments) Parse(body []byte) error {
	m.Segments = m.Segments[:0]
	m.Runs = nil
	it, err := ViewSegments(body)
	for s := (base.Segment{}); it.Next(&s); {
		m.Segments = append(m.Segments, s)
	}
	return err
}

// Validate checks every segment.
func (m *Segments) Validate() error { return validateSegments(m.Segments, m.Runs) }

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
//
// The body's codec is commitbody's, which the storage engine shares for its WAL commit
// records: Commit encodes with it and parses with ViewCommit.
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
func (m *Commit) BodySize() int { return commitbody.Size(len(m.Fences), m.Segments) }

func (m *Commit) appendFixed(dst []byte) []byte {
	dst = commitbody.AppendHeader(dst, m.Owner, m.Seq, len(m.Fences), len(m.Segments))
	for _, f := range m.Fences {
		dst = commitbody.AppendFence(dst, f.Table, f.Epoch)
	}
	return dst
}

// AppendBody appends the encoded body, copying the rows.
func (m *Commit) AppendBody(dst []byte) []byte {
	return appendSegmentsCopy(m.appendFixed(dst), m.Segments, m.Runs)
}

// Parse decodes body. The segments' Rows alias body. To walk a body without filling slices,
// use ViewCommit.
func (m *Commit) Parse(body []byte) error {
	m.Fences = m.Fences[:0]
	m.Segments = m.Segments[:0]
	m.Runs = nil
	v, err := ViewCommit(body)
	m.Owner, m.Seq = v.Owner, v.Seq
	for i := range v.FenceCount() {
		m.Fences = append(m.Fences, v.Fence(i))
	}
	it := v.Segments()
	for s := (base.Segment{}); it.Next(&s); {
		m.Segments = append(m.Segments, s)
	}
	return err
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
