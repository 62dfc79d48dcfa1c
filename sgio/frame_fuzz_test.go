package sgio

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/commitbody"
	"github.com/weftdb/weft/internal/corrupt"
)

// fuzzMaxBody is the receiver's limit under fuzzing: small, so a length field beyond it is
// rejected from the header alone.
const fuzzMaxBody = 8 << 10

// FuzzDecode feeds arbitrary bytes to Decode and ReadFrame: they never panic, reject bad input
// with an error, never hand out a body above the limit, and agree with each other. A frame
// that decodes has a body that its type's parser either accepts (and re-encodes to the same
// bytes) or rejects as malformed.
func FuzzDecode(f *testing.F) {
	for i, m := range sampleMessages() {
		frame := AppendFrame(nil, uint64(i), m)
		f.Add(frame)
		f.Add(frame[:len(frame)/2])
		bad := bytes.Clone(frame)
		bad[len(bad)-1] ^= 0x40
		f.Add(bad)
	}
	_, golden := goldenCommit()
	f.Add(AppendFrame(AppendFrame(nil, 1, golden), 2, &Ping{}))
	f.Add([]byte("WEFT"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		fr, n, err := Decode(data, fuzzMaxBody)
		switch {
		case err == ErrNeedMore:
			if n <= len(data) || n > HeaderSize+fuzzMaxBody {
				t.Fatalf("ErrNeedMore with n=%d for %d bytes", n, len(data))
			}
		case errors.Is(err, ErrUnknownType):
			if n != HeaderSize+len(fr.Body) || n > len(data) {
				t.Fatalf("unknown type: n=%d body=%d", n, len(fr.Body))
			}
		case err != nil:
			if n != 0 {
				t.Fatalf("error %v with n=%d", err, n)
			}
			if !errors.Is(err, corrupt.ErrCorruption) && !errors.Is(err, ErrFrameTooLarge) && !errors.Is(err, ErrBadVersion) {
				t.Fatalf("unclassified error %v", err)
			}
		default:
			if n != HeaderSize+len(fr.Body) || n > len(data) || len(fr.Body) > fuzzMaxBody {
				t.Fatalf("frame n=%d body=%d of %d bytes", n, len(fr.Body), len(data))
			}
			checkBody(t, fr.Type, fr.Body)
		}

		// ReadFrame over a stream of the same bytes agrees with Decode.
		rf, rn, rerr := ReadFrame(NewFrameReader(bytes.NewReader(data), fuzzMaxBody), fuzzMaxBody)
		switch {
		case err == ErrNeedMore:
			if !errors.Is(rerr, io.ErrUnexpectedEOF) && !(len(data) == 0 && rerr == io.EOF) {
				t.Fatalf("Decode needs more, ReadFrame says %v", rerr)
			}
		case err != nil:
			if rerr == nil || rerr.Error() != err.Error() {
				t.Fatalf("Decode: %v, ReadFrame: %v", err, rerr)
			}
		default:
			if rerr != nil || rn != n || rf.Type != fr.Type || rf.ID != fr.ID || !bytes.Equal(rf.Body, fr.Body) {
				t.Fatalf("ReadFrame disagrees: %v", rerr)
			}
		}
	})
}

// addBodySeeds seeds f, a fuzz target of (pick, body) over types, with the body of every
// sample message of one of types: under its index in types, and under the next index (the
// same bytes under the next type).
func addBodySeeds(f *testing.F, types []Type) {
	for _, m := range sampleMessages() {
		for i, t := range types {
			if m.Type() == t {
				body := m.AppendBody(nil)
				f.Add(uint8(i), body)
				f.Add(uint8(i+1), body)
			}
		}
	}
}

// checkBody parses body as type t: a parse either fails as malformed or round-trips exactly,
// and lists never hold more elements than the body has bytes for.
func checkBody(t *testing.T, typ Type, body []byte) {
	m := NewMessage(typ)
	if m == nil {
		t.Fatalf("Decode accepted unknown type %v", typ)
	}
	err := m.Parse(body)
	if err != nil {
		if !errors.Is(err, ErrMalformed) || !errors.Is(err, corrupt.ErrCorruption) {
			t.Fatalf("%v parse error not malformed: %v", typ, err)
		}
		return
	}
	if verr := m.Validate(); verr != nil {
		t.Fatalf("%v parsed but does not validate: %v", typ, verr)
	}
	if m.BodySize() != len(body) {
		t.Fatalf("%v BodySize %d for a body of %d", typ, m.BodySize(), len(body))
	}
	if enc := m.AppendBody(nil); !bytes.Equal(enc, body) {
		t.Fatalf("%v re-encodes differently", typ)
	}
	var elems, minSize int
	switch m := m.(type) {
	case *TableList:
		elems, minSize = len(m.Tables), tableInfoMin
	case *StatsReply:
		elems, minSize = len(m.Stats), statMin
	case *ReadPages:
		elems, minSize = len(m.Wants), pageWantSize
	case *PageDirReply:
		elems, minSize = len(m.Entries), 16
	case *Segments:
		elems, minSize = len(m.Segments), SegmentHeaderSize
		it, verr := ViewSegments(body)
		if verr != nil || it.Len() != len(m.Segments) {
			t.Fatalf("ViewSegments disagrees with Parse: %v", verr)
		}
		var got base.Segment
		for _, s := range m.Segments {
			if !it.Next(&got) || !segmentEqual(got, s) {
				t.Fatalf("ViewSegments segment differs")
			}
		}
	case *Commit:
		elems, minSize = len(m.Segments)+len(m.Fences), commitbody.FenceBytes
		v, verr := ViewCommit(body)
		if verr != nil || v.SegmentCount() != len(m.Segments) || v.FenceCount() != len(m.Fences) {
			t.Fatalf("ViewCommit disagrees with Parse: %v", verr)
		}
		it := v.Segments()
		var got base.Segment
		for _, s := range m.Segments {
			if !it.Next(&got) || !segmentEqual(got, s) {
				t.Fatalf("ViewCommit segment differs")
			}
		}
	}
	if elems*minSize > len(body) {
		t.Fatalf("%v: %d elements of at least %d bytes from a body of %d", typ, elems, minSize, len(body))
	}
}

func segmentEqual(a, b base.Segment) bool {
	return a.Table == b.Table && a.RowBytes == b.RowBytes && a.Page == b.Page && a.Data == b.Data &&
		a.Clear == b.Clear && bytes.Equal(a.Rows, b.Rows)
}
