package storenode

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/weftdb/weft/internal/checksum"
	"github.com/weftdb/weft/internal/corrupt"
)

// FuzzDecodeMetaBody fuzzes the meta file's body behind a valid checksum: FuzzDecodeMeta's
// inputs almost never pass the checksum, so the mutations never reach the tables, the page
// maps or the owners.
func FuzzDecodeMetaBody(f *testing.F) {
	for _, s := range metaSeeds() {
		f.Add(s[:len(s)-metaTrailerBytes])
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		b := binary.LittleEndian.AppendUint32(bytes.Clone(body), checksum.Of(body))
		b = binary.LittleEndian.AppendUint32(b, 0)
		m, err := decodeMeta(b)
		if err != nil {
			if !errors.Is(err, corrupt.ErrCorruption) && !errors.Is(err, ErrOldFormat) {
				t.Fatalf("not a corruption error: %v", err)
			}
			return
		}
		got := encodeMeta(m)
		if m.version != metaVersion && m.version != metaVersionCluster {
			m2, err := decodeMeta(got)
			if err != nil {
				t.Fatalf("upgraded meta does not decode: %v", err)
			}
			if again := encodeMeta(m2); !bytes.Equal(again, got) {
				t.Fatalf("upgraded meta re-encodes differently")
			}
			return
		}
		if !bytes.Equal(got, b) {
			t.Fatalf("decoded meta re-encodes differently:\n got %x\nwant %x", got, b)
		}
	})
}
