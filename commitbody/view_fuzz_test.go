package commitbody

import (
	"bytes"
	"errors"
	"testing"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/corrupt"
)

// FuzzDecode feeds arbitrary bytes to Decode: it never panics, rejects as malformed (and
// corruption) what it rejects, and what it accepts re-encodes to the same bytes, holds no more
// elements than the body has bytes for, and passes ValidateSegment segment by segment. sgio's
// FuzzDecode and FuzzMessages reach it through the wire's Commit and Segments bodies too.
func FuzzDecode(f *testing.F) {
	for _, body := range sampleBodies() {
		f.Add(body)
		f.Add(body[:len(body)/2])
		bad := bytes.Clone(body)
		bad[len(bad)-1] ^= 0x40
		f.Add(bad)
	}
	f.Add([]byte{})
	f.Add(make([]byte, HeaderBytes))
	f.Fuzz(func(t *testing.T, body []byte) {
		v, err := Decode(body)
		if err != nil {
			if !errors.Is(err, base.ErrMalformed) || !errors.Is(err, corrupt.ErrCorruption) {
				t.Fatalf("decode error not malformed: %v", err)
			}
			return
		}
		if HeaderBytes+v.FenceCount()*FenceBytes+v.SegmentCount()*SegmentHeaderBytes > len(body) {
			t.Fatalf("%d fences and %d segments from a body of %d", v.FenceCount(), v.SegmentCount(), len(body))
		}
		fences, segs := collect(&v)
		for i := range segs {
			if err := ValidateSegment(&segs[i]); err != nil {
				t.Fatalf("decoded segment %d does not validate: %v", i, err)
			}
		}
		if len(segs) != v.SegmentCount() {
			t.Fatalf("iterator gave %d of %d segments", len(segs), v.SegmentCount())
		}
		if enc := appendBody(nil, v.Owner, v.Seq, fences, segs); !bytes.Equal(enc, body) {
			t.Fatalf("re-encodes differently")
		}
	})
}
