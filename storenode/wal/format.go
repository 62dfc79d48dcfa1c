package wal

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"

	"github.com/weftdb/weft/internal/checksum"
	"github.com/weftdb/weft/internal/corrupt"
)

// The on-disk format: see the package doc and docs/wal.md. All integers are little-endian.
//
// Part of the format; do not change.
const (
	// segmentMagic is the first four bytes of every segment file: "WWAL".
	segmentMagic uint32 = 0x4c415757
	// segmentVersion is the format version in the segment header.
	segmentVersion uint32 = 1
	// segmentHeaderSize is the length of the segment header; records start after it.
	segmentHeaderSize = 32
	// segmentHeaderCRCOffset is where the segment header's CRC32C of bytes [0, 28) sits.
	segmentHeaderCRCOffset = 28

	// recordHeaderSize is the length of a record header.
	recordHeaderSize = 32
	// recordAlign is the alignment of every record in a segment: a record is padded with
	// zeros to a multiple of it, so recovery can scan for records in recordAlign steps.
	recordAlign = 8
	// recordPayloadBytesMax bounds the payload length field of any record, whatever the
	// options say (the length field is a uint32; this keeps sizes in int on 32-bit too).
	recordPayloadBytesMax = 1 << 30

	// Offsets of the record header fields.
	recordLengthOffset   = 0  // u32 payload length in bytes, without padding
	recordCRCOffset      = 4  // u32 CRC32C of bytes [0,4) and [8, end of padding)
	recordLSNOffset      = 8  // u64 LSN of this record, >= 1
	recordSyncedOffset   = 16 // u64 highest LSN durable when this record was written, < LSN
	recordKindOffset     = 24 // u8 kind, chosen by the storage engine
	recordReservedOffset = 25 // 7 bytes, zero

	// segmentNamePrefix and segmentNameSuffix surround the first LSN of a segment as 16
	// lowercase hex digits: wal-0000000000000001.log.
	segmentNamePrefix = "wal-"
	segmentNameSuffix = ".log"
)

// recordSize returns the bytes a record with a payload of n bytes takes in a segment.
func recordSize(n int) int {
	return recordHeaderSize + (n+recordAlign-1)&^(recordAlign-1)
}

// segmentName returns the file name of the segment whose first record has LSN first.
func segmentName(first uint64) string {
	return fmt.Sprintf("%s%016x%s", segmentNamePrefix, first, segmentNameSuffix)
}

// parseSegmentName returns the first LSN of a segment file name, and ok=false for names that
// are not segment names (other files in the directory are ignored).
func parseSegmentName(name string) (first uint64, ok bool) {
	hex, found := strings.CutPrefix(name, segmentNamePrefix)
	if !found {
		return 0, false
	}
	hex, found = strings.CutSuffix(hex, segmentNameSuffix)
	if !found || len(hex) != 16 {
		return 0, false
	}
	first, err := strconv.ParseUint(hex, 16, 64)
	if err != nil || segmentName(first) != name {
		return 0, false
	}
	return first, true
}

// encodeSegmentHeader fills b[:segmentHeaderSize] with the header of a segment whose first
// record has LSN first.
func encodeSegmentHeader(b []byte, first uint64) {
	clear(b[:segmentHeaderSize])
	binary.LittleEndian.PutUint32(b[0:], segmentMagic)
	binary.LittleEndian.PutUint32(b[4:], segmentVersion)
	binary.LittleEndian.PutUint64(b[8:], first)
	binary.LittleEndian.PutUint32(b[segmentHeaderCRCOffset:], checksum.Of(b[:segmentHeaderCRCOffset]))
}

// decodeSegmentHeader checks a segment header and returns its first LSN.
func decodeSegmentHeader(b []byte) (first uint64, err error) {
	if len(b) < segmentHeaderSize {
		return 0, corrupt.Errorf("wal: segment header: %d bytes, want %d", len(b), segmentHeaderSize)
	}
	if got, want := binary.LittleEndian.Uint32(b[segmentHeaderCRCOffset:]), checksum.Of(b[:segmentHeaderCRCOffset]); got != want {
		return 0, corrupt.Errorf("wal: segment header: checksum %#08x, want %#08x", got, want)
	}
	if m := binary.LittleEndian.Uint32(b[0:]); m != segmentMagic {
		return 0, corrupt.Errorf("wal: segment header: magic %#08x, want %#08x", m, segmentMagic)
	}
	if v := binary.LittleEndian.Uint32(b[4:]); v != segmentVersion {
		return 0, corrupt.Errorf("wal: segment header: version %d, want %d", v, segmentVersion)
	}
	for _, c := range b[16:segmentHeaderCRCOffset] {
		if c != 0 {
			return 0, corrupt.Errorf("wal: segment header: reserved bytes not zero")
		}
	}
	return binary.LittleEndian.Uint64(b[8:]), nil
}

// recordHeader is a decoded record header.
type recordHeader struct {
	payloadBytes  int
	lsn           uint64
	syncedThrough uint64
	kind          byte
}

// putRecordHeader writes the fields of a record header except the CRC and synced-through,
// which the writer fills in (finishRecord) just before the write.
func putRecordHeader(b []byte, payloadBytes int, lsn uint64, kind byte) {
	clear(b[:recordHeaderSize])
	binary.LittleEndian.PutUint32(b[recordLengthOffset:], uint32(payloadBytes))
	binary.LittleEndian.PutUint64(b[recordLSNOffset:], lsn)
	b[recordKindOffset] = kind
}

// finishRecord sets the synced-through LSN of the encoded record b (header, payload and
// padding, exactly recordSize bytes) and its CRC.
func finishRecord(b []byte, syncedThrough uint64) {
	binary.LittleEndian.PutUint64(b[recordSyncedOffset:], syncedThrough)
	binary.LittleEndian.PutUint32(b[recordCRCOffset:], recordCRC(b))
}

// recordCRC is the CRC32C of an encoded record without its CRC field.
func recordCRC(b []byte) uint32 {
	return checksum.Update(checksum.Of(b[recordLengthOffset:recordCRCOffset]), b[recordLSNOffset:])
}

// encodeRecord returns a complete encoded record. The writer builds records in place in its
// queue buffer instead; this is for tests and documentation.
func encodeRecord(lsn, syncedThrough uint64, kind byte, payload []byte) []byte {
	b := make([]byte, recordSize(len(payload)))
	putRecordHeader(b, len(payload), lsn, kind)
	copy(b[recordHeaderSize:], payload)
	finishRecord(b, syncedThrough)
	return b
}

// decodeRecord checks the record at the start of b and returns its header, its payload (a
// subslice of b) and its size in the segment. The length is checked against payloadBytesMax
// and against len(b) before anything else is looked at, so a bad length never makes the
// caller allocate or read beyond bounds. Every error wraps corrupt.ErrCorruption; an all-zero
// header also wraps errEndOfLog.
func decodeRecord(b []byte, payloadBytesMax int) (h recordHeader, payload []byte, size int, err error) {
	if len(b) < recordHeaderSize {
		return h, nil, 0, corrupt.Errorf("wal: record header cut short: %d bytes", len(b))
	}
	if isZero(b[:recordHeaderSize]) {
		return h, nil, 0, corrupt.Errorf("%w", errEndOfLog)
	}
	n := int64(binary.LittleEndian.Uint32(b[recordLengthOffset:]))
	if n > int64(payloadBytesMax) || n > recordPayloadBytesMax {
		return h, nil, 0, corrupt.Errorf("wal: record payload length %d exceeds %d", n, payloadBytesMax)
	}
	size = recordSize(int(n))
	if size > len(b) {
		return h, nil, 0, corrupt.Errorf("wal: record of %d bytes cut short at %d", size, len(b))
	}
	if got, want := binary.LittleEndian.Uint32(b[recordCRCOffset:]), recordCRC(b[:size]); got != want {
		return h, nil, 0, corrupt.Errorf("wal: record checksum %#08x, want %#08x", got, want)
	}
	h = recordHeader{
		payloadBytes:  int(n),
		lsn:           binary.LittleEndian.Uint64(b[recordLSNOffset:]),
		syncedThrough: binary.LittleEndian.Uint64(b[recordSyncedOffset:]),
		kind:          b[recordKindOffset],
	}
	// The checks below only fail for a record written by another version or by a bug: the
	// CRC matched.
	if !isZero(b[recordReservedOffset:recordHeaderSize]) || !isZero(b[recordHeaderSize+h.payloadBytes:size]) {
		return recordHeader{}, nil, 0, corrupt.Errorf("wal: record LSN %d: reserved or padding bytes not zero", h.lsn)
	}
	if h.lsn == 0 || h.syncedThrough >= h.lsn {
		return recordHeader{}, nil, 0, corrupt.Errorf("wal: record LSN %d synced through %d: out of order", h.lsn, h.syncedThrough)
	}
	return h, b[recordHeaderSize : recordHeaderSize+h.payloadBytes : recordHeaderSize+h.payloadBytes], size, nil
}

func isZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
