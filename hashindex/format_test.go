package hashindex

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/internal/checksum"
	"github.com/weftdb/weft/internal/corrupt"
)

func testHeader() header {
	return header{keyBytes: 16, unique: true, salt: 0x0123456789abcdef, buckets: 70, dirHead: 5, dirTail: 9, dirRows: 3}
}

func TestHeaderRoundTrip(t *testing.T) {
	for _, rb := range []int{64, 256, 4096} {
		h := testHeader()
		h.dirRows = (h.buckets + uint64(dirEntriesPerRow(rb)) - 1) / uint64(dirEntriesPerRow(rb))
		if h.dirRows == 1 {
			h.dirTail = h.dirHead
		}
		row := make([]byte, rb)
		h.encode(row)
		got, err := decodeHeader(row)
		require.NoError(t, err)
		require.Equal(t, h, got)
	}
}

// TestHeaderRejects: every damage, foreign table and unknown version is corruption.
func TestHeaderRejects(t *testing.T) {
	h := testHeader()
	good := make([]byte, 256)
	h.dirRows = 3 // 70 buckets / 29 per row
	h.encode(good)
	_, err := decodeHeader(good)
	require.NoError(t, err)
	resum := func(row []byte) { binary.LittleEndian.PutUint32(row, checksum.Of(row[4:headerBytes])) }
	cases := map[string]func(row []byte){
		"bit flip":       func(row []byte) { row[30] ^= 1 },
		"checksum":       func(row []byte) { row[0] ^= 0x80 },
		"zeros":          func(row []byte) { clear(row) },
		"magic":          func(row []byte) { row[4] = 'X'; resum(row) },
		"version 2":      func(row []byte) { binary.LittleEndian.PutUint16(row[8:], 2); resum(row) },
		"key size 0":     func(row []byte) { binary.LittleEndian.PutUint16(row[10:], 0); resum(row) },
		"key too large":  func(row []byte) { binary.LittleEndian.PutUint16(row[10:], 300); resum(row) },
		"unknown flag":   func(row []byte) { row[12] |= 2; resum(row) },
		"reserved":       func(row []byte) { row[60] = 1; resum(row) },
		"no buckets":     func(row []byte) { binary.LittleEndian.PutUint64(row[24:], 0); resum(row) },
		"dir rows count": func(row []byte) { binary.LittleEndian.PutUint64(row[48:], 4); resum(row) },
		"dir head none":  func(row []byte) { binary.LittleEndian.PutUint64(row[32:], 0); resum(row) },
	}
	for name, damage := range cases {
		row := bytes.Clone(good)
		damage(row)
		_, err := decodeHeader(row)
		require.ErrorIs(t, err, corrupt.ErrCorruption, name)
	}
	_, err = decodeHeader(good[:48])
	require.ErrorIs(t, err, corrupt.ErrCorruption)
}

func TestRowRoundTripAndRejects(t *testing.T) {
	f := newRowFormat(128, 8, 42)
	row := make([]byte, 128)
	for i := range 3 {
		copy(row[rowHeaderBytes+16*i:], "key-000"+string(rune('0'+i)))
		binary.LittleEndian.PutUint64(row[rowHeaderBytes+16*i+8:], uint64(i)*7)
	}
	f.encodeRow(row, &rowView{kind: kindBucket, level: 3, count: 3, number: 5, next: 77})
	v, err := f.decodeRow(row)
	require.NoError(t, err)
	require.Equal(t, uint8(kindBucket), v.kind)
	require.Equal(t, uint8(3), v.level)
	require.Equal(t, 3, v.count)
	require.Equal(t, uint64(5), v.number)
	require.Equal(t, uint64(77), v.next)
	require.Len(t, v.body, 48)

	resum := func(row []byte) { binary.LittleEndian.PutUint32(row, f.rowSum(row)) }
	cases := map[string]func(row []byte){
		"bit flip":          func(row []byte) { row[40] ^= 4 },
		"kind":              func(row []byte) { row[4] = 9; resum(row) },
		"bucket past level": func(row []byte) { row[5] = 2; resum(row) },
		"level too high":    func(row []byte) { row[5] = 60; resum(row) },
		"count":             func(row []byte) { row[6] = 5; resum(row) }, // capacity (128-24)/16 = 6: 5 fits, but bytes after 3 are zero... so use tail
		"bytes after":       func(row []byte) { row[127] = 1; resum(row) },
		"over capacity":     func(row []byte) { binary.LittleEndian.PutUint16(row[6:], 7); resum(row) },
		"empty overflow": func(row []byte) {
			row[4], row[5] = kindOverflow, 0
			binary.LittleEndian.PutUint16(row[6:], 0)
			clear(row[rowHeaderBytes:])
			resum(row)
		},
		"dir with level": func(row []byte) { row[4] = kindDirectory; resum(row) },
	}
	for name, damage := range cases {
		r := bytes.Clone(row)
		damage(r)
		_, err := f.decodeRow(r)
		if name == "count" || name == "bytes after" {
			require.NoError(t, err, "%s: well-formed (bytes after the entries are not read)", name)
			continue
		}
		require.ErrorIs(t, err, corrupt.ErrCorruption, name)
	}
	// Another index's row (another salt) fails its checksum.
	other := newRowFormat(128, 8, 43)
	_, err = other.decodeRow(row)
	require.ErrorIs(t, err, corrupt.ErrCorruption)
	_, err = f.decodeRow(row[:120])
	require.ErrorIs(t, err, corrupt.ErrCorruption)
}

func TestAddress(t *testing.T) {
	// Every hash lands in [0, n), at the level its bucket has: level L+1 below the split
	// pointer and from 2^L, L between.
	for n := uint64(1); n < 300; n++ {
		L := uint8(63)
		for 1<<L > n {
			L--
		}
		for h := uint64(0); h < 2048; h += 7 {
			hh := h * 0x9E3779B97F4A7C15
			b, level := address(hh, n)
			require.Less(t, b, n)
			want := L
			if b < n-1<<L || b >= 1<<L {
				want = L + 1
			}
			require.Equal(t, want, level, "n %d bucket %d", n, b)
			require.Equal(t, b, mask(hh, level))
		}
	}
}

func TestKeyHashSpreads(t *testing.T) {
	// The format's hash: fixed values (a change breaks every index on disk), and low bits
	// that spread sequential keys evenly.
	require.Equal(t, uint64(0xc5031d322dd4ab55), keyHash(1, []byte("player01")))
	require.Equal(t, uint64(0x91606bc4ab70c9bb), keyHash(0, []byte{7}))
	require.Equal(t, uint64(0x670925a5f8f07c80), keyHash(99, make([]byte, 20)))
	require.NotEqual(t, keyHash(1, []byte("player01")), keyHash(2, []byte("player01")))
	require.NotEqual(t, keyHash(1, []byte("a")), keyHash(1, []byte("a\x00")))
	var counts [64]int
	for i := range 64 * 1000 {
		var k [16]byte
		binary.LittleEndian.PutUint64(k[:], uint64(i))
		counts[keyHash(7, k[:])&63]++
	}
	for b, c := range counts {
		require.InDelta(t, 1000, c, 200, "bucket %d", b)
	}
}

// TestKeyHash16: the fast path's hash of a 16-byte key is the format's.
func TestKeyHash16(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 1000 {
		var k [16]byte
		for i := range k {
			k[i] = byte(rng.Uint32())
		}
		salt := rng.Uint64()
		require.Equal(t, keyHash(salt, k[:]), keyHash16(salt, binary.LittleEndian.Uint64(k[:]), binary.LittleEndian.Uint64(k[8:])))
	}
}

// TestProbeBucket: Lookup's fast path on a bucket row finds what decodeRow's entries hold,
// for 16-byte keys (the word loop) and others. A row at a version not yet verified has its
// checksum checked (and asks for the version to be recorded); at the verified version it is
// not checked again, at any other version it is; a row of another bucket, or with a bad
// checksum, is left to the general path.
func TestProbeBucket(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, kb := range []int{16, 4, 8, 13, 32} {
		rb := DefaultRowBytes(kb)
		f := newRowFormat(rb, kb, 0x5eed)
		ix := &Index{fmt: f, entries: f.entries}
		for count := 0; count <= f.entries; count++ {
			row := make([]byte, rb)
			keys := make([][]byte, count)
			for i := range count {
				keys[i] = make([]byte, kb)
				for j := range keys[i] {
					keys[i][j] = byte(rng.Uint32())
				}
				off := rowHeaderBytes + i*f.entryBytes
				copy(row[off:], keys[i])
				binary.LittleEndian.PutUint64(row[off+kb:], uint64(1000+i))
			}
			next := uint64(noRow)
			if count%2 == 1 {
				next = 77
			}
			const b, level = 5, 3
			f.encodeRow(row, &rowView{kind: kindBucket, level: level, count: count, number: b, next: next})
			sl := &dirSlot{id: 42}
			h := uint64(b) | 0xabc0 // mask(h, 3) == 5
			absent := make([]byte, kb)
			absent[0] = 1 // the keys are random: a clash with one is 2^-8kb
			const ver = 9
			_, r, memo := ix.probeBucket(sl, b, level, h, absent, row, ver)
			require.NotEqual(t, fastSlow, r)
			require.Equal(t, memoOf(ver), memo, "not verified yet: checked, to be recorded")
			require.NotZero(t, memo)
			sl.checked = memo
			for i, k := range keys {
				id, r, memo := ix.probeBucket(sl, b, level, h, k, row, ver)
				require.Equal(t, fastFound, r, "kb %d count %d key %d", kb, count, i)
				require.Equal(t, uint64(1000+i), id)
				require.Zero(t, memo, "verified at this version")
			}
			_, r, _ = ix.probeBucket(sl, b, level, h, absent, row, ver)
			if next == noRow {
				require.Equal(t, fastAbsent, r)
			} else {
				require.Equal(t, fastChain, r)
			}
			_, r, _ = ix.probeBucket(sl, b+8, level, h, absent, row, ver)
			require.Equal(t, fastSlow, r, "another bucket's number")
			if count > 0 {
				row[rowHeaderBytes] ^= 1 // a changed row has another version: checked again
				_, r, memo = ix.probeBucket(sl, b, level, h, keys[0], row, ver+1)
				require.Equal(t, fastSlow, r, "bad checksum at a new version")
				require.Zero(t, memo)
			}
		}
	}
}
