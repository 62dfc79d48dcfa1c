package storenode

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/weftdb/weft/internal/checksum"
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
		checkMetaRoundTrip(t, b)
	})
}
