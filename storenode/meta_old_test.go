package storenode

import (
	"encoding/binary"

	"github.com/weftdb/weft/internal/checksum"
)

// encodeSparseMeta encodes m as the version-3 meta file the build before the map log wrote:
// every table's sparse page map inside the meta file (16 bytes a leaf, 24 an entry).
func encodeSparseMeta(m *metaState) []byte {
	v4 := encodeMeta(m)
	b := append([]byte(nil), v4[:metaHeaderBytes]...)
	binary.LittleEndian.PutUint32(b[8:], metaVersionSparse)
	p := v4[metaV4HeaderBytes:]
	for _, t := range m.tables {
		n := metaTableBytes + pad8(len(t.name))
		hdr := append([]byte(nil), p[:n]...)
		binary.LittleEndian.PutUint32(hdr[32:], uint32(t.pages.leafCount()))
		binary.LittleEndian.PutUint32(hdr[36:], uint32(t.pages.count()))
		b = append(b, hdr...)
		p = p[n:]
		t.pages.eachLeaf(func(leaf, mask uint64, ents []mapEntry) bool {
			b = binary.LittleEndian.AppendUint32(b, uint32(leaf))
			b = binary.LittleEndian.AppendUint32(b, 0)
			b = binary.LittleEndian.AppendUint64(b, mask)
			for _, e := range ents {
				b = binary.LittleEndian.AppendUint32(b, e.disk)
				b = binary.LittleEndian.AppendUint32(b, e.crc)
				b = binary.LittleEndian.AppendUint64(b, e.lsn)
				b = binary.LittleEndian.AppendUint64(b, e.present)
			}
			return true
		})
	}
	b = append(b, p[:len(p)-metaTrailerBytes]...)
	b = binary.LittleEndian.AppendUint32(b, checksum.Of(b))
	return binary.LittleEndian.AppendUint32(b, 0)
}

// encodeMetaAndLog encodes m as a version-4 meta file and its map log of generation 1 (m's
// log fields are set), as a checkpoint that compacted would.
func encodeMetaAndLog(m *metaState) (meta, log []byte) {
	m.version, m.logGen = metaVersion, 0
	log = encodeMapLog(m, 1)
	if mapLogLiveBytes(m) > mapLogHeaderBytes {
		m.logGen = 1
		m.logLen = uint64(len(log))
	} else {
		log, m.logLen = nil, 0
	}
	return encodeMeta(m), log
}
