package hashindex

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/weftdb/weft/internal/corrupt"
)

// FuzzDecodeRow feeds arbitrary bytes to the header and row decoders (and to the cache-hit
// path's search, probeBucket, which must not panic either): they return a value or
// an error wrapping corrupt.ErrCorruption, never panic; a row they accept re-encodes to the
// same bytes. The checksum is recomputed over the input too, so the fuzzer reaches the
// structural checks behind it.
func FuzzDecodeRow(f *testing.F) {
	// Seeds: a header, a bucket, an overflow and a directory row.
	hdr := make([]byte, 64)
	(&header{keyBytes: 8, salt: 9, buckets: 3, dirHead: 1, dirTail: 1, dirRows: 1}).encode(hdr)
	f.Add(uint8(8), hdr)
	rf := newRowFormat(64, 8, 9)
	for _, v := range []rowView{
		{kind: kindBucket, level: 2, count: 2, number: 3, next: 12},
		{kind: kindOverflow, count: 1, number: 3},
		{kind: kindDirectory, count: 3, number: 0},
	} {
		row := make([]byte, 64)
		entryBytes := 16
		if v.kind == kindDirectory {
			entryBytes = 8
		}
		for i := range v.count * entryBytes {
			row[rowHeaderBytes+i] = byte(i + 1)
		}
		rf.encodeRow(row, &v)
		f.Add(uint8(8), row)
	}
	f.Add(uint8(1), make([]byte, 128))
	f.Fuzz(func(t *testing.T, keyBytes uint8, data []byte) {
		check := func(err error) {
			if err != nil && !errors.Is(err, corrupt.ErrCorruption) {
				t.Fatalf("error without the corruption marker: %v", err)
			}
		}
		if h, err := decodeHeader(data); err == nil {
			again := make([]byte, len(data))
			h.encode(again)
			if !bytes.Equal(again[:headerBytes], data[:headerBytes]) {
				t.Fatalf("header re-encodes differently")
			}
		} else {
			check(err)
		}
		if keyBytes == 0 || int(keyBytes)+rowHeaderBytes+entryIDBytes > len(data) {
			return
		}
		f := newRowFormat(len(data), int(keyBytes), 9)
		for _, fix := range []bool{false, true} {
			row := bytes.Clone(data)
			if fix && len(row) >= rowHeaderBytes {
				binary.LittleEndian.PutUint32(row, f.rowSum(row))
			}
			// Lookup's fast path, on a row taken as verified and on one to check: whatever
			// its count says, it stays within the row.
			ix := &Index{fmt: f, entries: f.entries}
			for _, checked := range []uint64{0, memoOf(1)} {
				sl := &dirSlot{id: 1, checked: checked}
				ix.probeBucket(sl, uint64(row[8]&7), row[5], uint64(row[8]), make([]byte, keyBytes), row, 1)
			}
			v, err := f.decodeRow(row)
			if err != nil {
				check(err)
				continue
			}
			again := make([]byte, len(row))
			copy(again[rowHeaderBytes:], v.body)
			f.encodeRow(again, &v)
			if n := rowHeaderBytes + len(v.body); !bytes.Equal(again[:n], row[:n]) {
				t.Fatalf("row re-encodes differently")
			}
		}
	})
}
