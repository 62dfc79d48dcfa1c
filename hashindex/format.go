package hashindex

import (
	"encoding/binary"
	"math/bits"

	"github.com/weftdb/weft/internal/checksum"
	"github.com/weftdb/weft/internal/corrupt"
)

// The on-disk format (see the package doc and docs/hashindex.md). Part of the format; do not
// change: a change needs a new formatVersion and a reader for the old one.
const (
	headerMagic   = 0x58484657 // "WFHX" little-endian
	formatVersion = 1
	headerBytes   = 64 // the header's fields and checksum cover bytes [0, 64) of its row

	rowHeaderBytes = 24 // every bucket, overflow and directory row starts with this
	entryIDBytes   = 8  // an entry is the key followed by the row id, little-endian

	kindBucket    = 1 // a bucket's primary row: its id never changes, it is never deleted
	kindOverflow  = 2 // a row of a bucket's overflow chain
	kindDirectory = 3 // a row of the directory: bucket number -> primary row id

	flagUnique = 1 << 0

	noRow = 0 // "no next row": id 0 is the header or was never allocated (see layout)

	hashMul = 0x9E3779B97F4A7C15 // the 64-bit golden ratio; chunk mixing of keyHash
	hashRot = 31
	mixMul1 = 0xbf58476d1ce4e5b9 // splitmix64's finaliser
	mixMul2 = 0x94d049bb133111eb
)

// Limits of the options, not of the format.
const (
	// KeyBytesMax is the largest key.
	KeyBytesMax = 256
	// RowBytesMax is the largest bucket row (the table row size limit).
	RowBytesMax = 4096
	// levelMax bounds a bucket's level: 2^levelMax buckets are out of reach anyway.
	levelMax = 56
)

// header is the index's first row: what the index is and where its directory lives.
type header struct {
	keyBytes int
	unique   bool
	salt     uint64
	buckets  uint64 // n: buckets in use, numbered [0, n)
	dirHead  uint64 // row id of directory row 0
	dirTail  uint64 // row id of the last directory row
	dirRows  uint64 // directory rows in the chain
}

func (h *header) encode(row []byte) {
	clear(row)
	binary.LittleEndian.PutUint32(row[4:], headerMagic)
	binary.LittleEndian.PutUint16(row[8:], formatVersion)
	binary.LittleEndian.PutUint16(row[10:], uint16(h.keyBytes))
	var flags uint16
	if h.unique {
		flags |= flagUnique
	}
	binary.LittleEndian.PutUint16(row[12:], flags)
	binary.LittleEndian.PutUint64(row[16:], h.salt)
	binary.LittleEndian.PutUint64(row[24:], h.buckets)
	binary.LittleEndian.PutUint64(row[32:], h.dirHead)
	binary.LittleEndian.PutUint64(row[40:], h.dirTail)
	binary.LittleEndian.PutUint64(row[48:], h.dirRows)
	binary.LittleEndian.PutUint32(row[0:], checksum.Of(row[4:headerBytes]))
}

// decodeHeader checks and decodes a header row. Every failure wraps corrupt.ErrCorruption: a
// row that is not a header of this format is never read as one.
func decodeHeader(row []byte) (header, error) {
	var h header
	if len(row) < headerBytes || len(row)%8 != 0 || len(row) > RowBytesMax {
		return h, corrupt.Errorf("hashindex: header row of %d bytes", len(row))
	}
	if got, want := binary.LittleEndian.Uint32(row[0:]), checksum.Of(row[4:headerBytes]); got != want {
		return h, corrupt.Errorf("hashindex: header checksum %#x, computed %#x (not an index, or damaged)", got, want)
	}
	if m := binary.LittleEndian.Uint32(row[4:]); m != headerMagic {
		return h, corrupt.Errorf("hashindex: header magic %#x, not an index", m)
	}
	if v := binary.LittleEndian.Uint16(row[8:]); v != formatVersion {
		return h, corrupt.Errorf("hashindex: format version %d, this build reads %d", v, formatVersion)
	}
	h.keyBytes = int(binary.LittleEndian.Uint16(row[10:]))
	flags := binary.LittleEndian.Uint16(row[12:])
	h.unique = flags&flagUnique != 0
	h.salt = binary.LittleEndian.Uint64(row[16:])
	h.buckets = binary.LittleEndian.Uint64(row[24:])
	h.dirHead = binary.LittleEndian.Uint64(row[32:])
	h.dirTail = binary.LittleEndian.Uint64(row[40:])
	h.dirRows = binary.LittleEndian.Uint64(row[48:])
	switch {
	case flags&^flagUnique != 0 || binary.LittleEndian.Uint16(row[14:]) != 0 || binary.LittleEndian.Uint64(row[56:]) != 0:
		return h, corrupt.Errorf("hashindex: header has unknown flags or reserved bytes set")
	case h.keyBytes < 1 || h.keyBytes > KeyBytesMax || entriesPerRow(len(row), h.keyBytes) < 1:
		return h, corrupt.Errorf("hashindex: header key size %d for %d-byte rows", h.keyBytes, len(row))
	case h.buckets < 1 || h.buckets > 1<<levelMax:
		return h, corrupt.Errorf("hashindex: header counts %d buckets", h.buckets)
	case h.dirRows != (h.buckets+uint64(dirEntriesPerRow(len(row)))-1)/uint64(dirEntriesPerRow(len(row))):
		return h, corrupt.Errorf("hashindex: header counts %d directory rows for %d buckets", h.dirRows, h.buckets)
	case h.dirHead == noRow || h.dirTail == noRow || (h.dirRows == 1) != (h.dirHead == h.dirTail):
		return h, corrupt.Errorf("hashindex: header directory rows %d..%d", h.dirHead, h.dirTail)
	}
	return h, nil
}

// entriesPerRow is how many (key, id) entries a bucket or overflow row holds.
func entriesPerRow(rowBytes, keyBytes int) int {
	return (rowBytes - rowHeaderBytes) / (keyBytes + entryIDBytes)
}

// dirEntriesPerRow is how many bucket row ids a directory row holds.
func dirEntriesPerRow(rowBytes int) int { return (rowBytes - rowHeaderBytes) / 8 }

// rowView is a decoded bucket, overflow or directory row; body aliases the row's bytes.
type rowView struct {
	kind   uint8
	level  uint8  // a bucket's level; 0 for the others
	count  int    // entries in use
	number uint64 // bucket number (bucket, overflow) or directory row number
	next   uint64 // next row of the chain, or noRow
	body   []byte // the entries: count * (keyBytes+8) or count * 8 bytes
}

// rowFormat is what a row decoder needs to know of its index.
type rowFormat struct {
	rowBytes, keyBytes int
	salt               uint64
	saltSum            uint32 // CRC32C of the salt, little-endian: where every row sum starts
	// Precomputed, as they are needed on every read: a division costs more than the rest
	// of a row's checks.
	entryBytes, entries, dirEntries int
}

func newRowFormat(rowBytes, keyBytes int, salt uint64) rowFormat {
	var s [8]byte
	binary.LittleEndian.PutUint64(s[:], salt)
	return rowFormat{rowBytes: rowBytes, keyBytes: keyBytes, salt: salt, saltSum: checksum.Of(s[:]),
		entryBytes: keyBytes + entryIDBytes, entries: entriesPerRow(rowBytes, keyBytes), dirEntries: dirEntriesPerRow(rowBytes)}
}

// rowSum is the checksum of a non-header row: CRC32C of the salt, then of the row from
// after the checksum field to the end of its entries (count of them, as the row says, at
// most what fits). The salt makes a row of another index (or of any other table) fail it;
// bytes after the entries are written as zero and never read, so they are not summed (a
// lookup sums a third of a typical row instead of all of it).
func (f *rowFormat) rowSum(row []byte) uint32 {
	entryBytes := f.entryBytes
	if row[4] == kindDirectory {
		entryBytes = 8
	}
	end := min(len(row), rowHeaderBytes+int(binary.LittleEndian.Uint16(row[6:]))*entryBytes)
	return checksum.Update(f.saltSum, row[4:end])
}

// encodeRow writes v's header fields and checksum into row, whose entries (from
// rowHeaderBytes) the caller has already written; bytes after them should be zero.
func (f *rowFormat) encodeRow(row []byte, v *rowView) {
	row[4] = v.kind
	row[5] = v.level
	binary.LittleEndian.PutUint16(row[6:], uint16(v.count))
	binary.LittleEndian.PutUint64(row[8:], v.number)
	binary.LittleEndian.PutUint64(row[16:], v.next)
	binary.LittleEndian.PutUint32(row[0:], f.rowSum(row))
}

// decodeRow checks and decodes a bucket, overflow or directory row. Every failure wraps
// corrupt.ErrCorruption; it never panics, whatever the bytes.
func (f *rowFormat) decodeRow(row []byte) (rowView, error) {
	var v rowView
	if len(row) != f.rowBytes || len(row) < rowHeaderBytes {
		return v, corrupt.Errorf("hashindex: row of %d bytes, index rows have %d", len(row), f.rowBytes)
	}
	if got, want := binary.LittleEndian.Uint32(row[0:]), f.rowSum(row); got != want {
		return v, corrupt.Errorf("hashindex: row checksum %#x, computed %#x", got, want)
	}
	v.kind, v.level = row[4], row[5]
	v.count = int(binary.LittleEndian.Uint16(row[6:]))
	v.number = binary.LittleEndian.Uint64(row[8:])
	v.next = binary.LittleEndian.Uint64(row[16:])
	entryBytes, capacity := f.entryBytes, f.entries
	switch v.kind {
	case kindBucket:
		if v.level > levelMax || v.number >= 1<<v.level {
			return v, corrupt.Errorf("hashindex: bucket %d at level %d", v.number, v.level)
		}
	case kindOverflow:
		if v.level != 0 || v.number >= 1<<levelMax {
			return v, corrupt.Errorf("hashindex: overflow row of bucket %d, level %d", v.number, v.level)
		}
	case kindDirectory:
		entryBytes, capacity = 8, f.dirEntries
		if v.level != 0 {
			return v, corrupt.Errorf("hashindex: directory row %d, level %d", v.number, v.level)
		}
	default:
		return v, corrupt.Errorf("hashindex: row kind %d", v.kind)
	}
	if v.count > capacity || (v.kind == kindOverflow && v.count == 0) {
		return v, corrupt.Errorf("hashindex: row of kind %d holds %d entries, capacity %d", v.kind, v.count, capacity)
	}
	v.body = row[rowHeaderBytes : rowHeaderBytes+v.count*entryBytes]
	return v, nil
}

// keyHash is the index's hash of a key, keyed by the index's salt: 8-byte little-endian
// chunks (the last one zero-padded) mixed by multiply-rotate, then splitmix64's finaliser, so
// the low bits that address buckets depend on every key bit. Part of the format.
func keyHash(salt uint64, key []byte) uint64 {
	h := salt ^ uint64(len(key))*hashMul
	for len(key) >= 8 {
		h = bits.RotateLeft64((h^binary.LittleEndian.Uint64(key))*hashMul, hashRot)
		key = key[8:]
	}
	if len(key) > 0 {
		var tail [8]byte
		copy(tail[:], key)
		h = bits.RotateLeft64((h^binary.LittleEndian.Uint64(tail[:]))*hashMul, hashRot)
	}
	return mixHash(h)
}

// mixHash is keyHash's finalizer: it spreads every bit of h over the result.
func mixHash(h uint64) uint64 {
	h ^= h >> 30
	h *= mixMul1
	h ^= h >> 27
	h *= mixMul2
	h ^= h >> 31
	return h
}

// keyHash16 is keyHash of a 16-byte key whose little-endian words are k0 and k1, without the
// loop (Lookup's fast path has the words at hand).
func keyHash16(salt, k0, k1 uint64) uint64 {
	n := uint64(16)
	h := salt ^ n*hashMul
	h = bits.RotateLeft64((h^k0)*hashMul, hashRot)
	h = bits.RotateLeft64((h^k1)*hashMul, hashRot)
	return mixHash(h)
}

// address is the linear-hashing address of hash h among n buckets, and the level it was
// computed at: with 2^L <= n < 2^(L+1), buckets [n-2^L, 2^L) are at level L and the others
// (already split this round, or new) at level L+1.
func address(h, n uint64) (bucket uint64, level uint8) {
	l := uint8(bits.Len64(n) - 1)
	b := h & (1<<l - 1)
	if b < n-1<<l {
		return h & (1<<(l+1) - 1), l + 1
	}
	return b, l
}

// mask returns the low level bits of h.
func mask(h uint64, level uint8) uint64 { return h & (1<<level - 1) }
