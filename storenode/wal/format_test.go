package wal

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/corrupt"
)

func TestRecordRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		payloadBytes int
		size         int
	}{
		{0, 32}, {1, 40}, {7, 40}, {8, 40}, {9, 48}, {64, 96}, {4096, 4128}, {4097, 4136},
	} {
		p := bytes.Repeat([]byte{0xa5}, tc.payloadBytes)
		b := encodeRecord(1000, 998, 9, p)
		require.Len(t, b, tc.size)
		require.Equal(t, tc.size, recordSize(tc.payloadBytes))
		h, payload, size, err := decodeRecord(append(b, 1, 2, 3), tc.payloadBytes)
		require.NoError(t, err)
		require.Equal(t, recordHeader{payloadBytes: tc.payloadBytes, lsn: 1000, syncedThrough: 998, kind: 9}, h)
		require.Equal(t, p, payload)
		require.Equal(t, tc.size, size)
		if tc.payloadBytes > 0 {
			_, _, _, err = decodeRecord(b, tc.payloadBytes-1)
			require.ErrorIs(t, err, corrupt.ErrCorruption, "length above the bound")
		}
	}
}

func TestDecodeRecordErrors(t *testing.T) {
	good := encodeRecord(5, 4, 1, []byte("payload"))
	mutate := func(f func(b []byte)) []byte {
		b := bytes.Clone(good)
		f(b)
		return b
	}
	reCRC := func(b []byte) { binary.LittleEndian.PutUint32(b[recordCRCOffset:], recordCRC(b)) }
	for name, b := range map[string][]byte{
		"empty":          nil,
		"short header":   good[:31],
		"short payload":  good[:len(good)-1],
		"zero header":    make([]byte, 64),
		"checksum":       mutate(func(b []byte) { b[recordHeaderSize] ^= 1 }),
		"padding":        mutate(func(b []byte) { b[len(b)-1] = 1 }),
		"length":         mutate(func(b []byte) { b[0] = 0xff }),
		"huge length":    mutate(func(b []byte) { binary.LittleEndian.PutUint32(b, 0xffffffff) }),
		"reserved":       mutate(func(b []byte) { b[recordReservedOffset+3] = 1; reCRC(b) }),
		"padding re-crc": mutate(func(b []byte) { b[len(b)-1] = 1; reCRC(b) }),
		"lsn zero":       mutate(func(b []byte) { binary.LittleEndian.PutUint64(b[recordLSNOffset:], 0); reCRC(b) }),
		"synced >= lsn":  mutate(func(b []byte) { binary.LittleEndian.PutUint64(b[recordSyncedOffset:], 5); reCRC(b) }),
	} {
		_, _, _, err := decodeRecord(b, 1<<20)
		require.ErrorIs(t, err, corrupt.ErrCorruption, name)
		if name == "zero header" {
			require.ErrorIs(t, err, errEndOfLog)
		} else {
			require.NotErrorIs(t, err, errEndOfLog, name)
		}
	}
}

func TestSegmentHeader(t *testing.T) {
	b := make([]byte, segmentHeaderSize)
	encodeSegmentHeader(b, 77)
	first, err := decodeSegmentHeader(b)
	require.NoError(t, err)
	require.Equal(t, uint64(77), first)
	for i := range b {
		c := bytes.Clone(b)
		c[i] ^= 0x10
		_, err := decodeSegmentHeader(c)
		require.ErrorIs(t, err, corrupt.ErrCorruption, "byte %d", i)
	}
	_, err = decodeSegmentHeader(b[:31])
	require.ErrorIs(t, err, corrupt.ErrCorruption)
}

func TestSegmentName(t *testing.T) {
	require.Equal(t, "wal-0000000000000001.log", segmentName(1))
	require.Equal(t, "wal-00000000deadbeef.log", segmentName(0xdeadbeef))
	for name, want := range map[string]uint64{
		"wal-0000000000000001.log": 1,
		"wal-ffffffffffffffff.log": 1<<64 - 1,
	} {
		got, ok := parseSegmentName(name)
		require.True(t, ok, name)
		require.Equal(t, want, got)
	}
	for _, name := range []string{
		"wal.lock", "wal-1.log", "wal-00000000000000001.log", "wal-000000000000000G.log",
		"wal-00000000DEADBEEF.log", "wal-0000000000000001.log.tmp", "x-0000000000000001.log",
	} {
		_, ok := parseSegmentName(name)
		require.False(t, ok, name)
	}
}

// goldenHex returns the bytes of the hex dump that follows the marker line in docs/wal.md,
// up to the closing fence; a dump line is "offset: hex bytes", and '#' starts a comment.
func goldenHex(t *testing.T, doc []byte, marker string) []byte {
	t.Helper()
	sc := bufio.NewScanner(bytes.NewReader(doc))
	found, inBlock := false, false
	var out []byte
	for sc.Scan() {
		line := sc.Text()
		switch {
		case !found:
			found = strings.Contains(line, marker)
		case !inBlock:
			inBlock = strings.HasPrefix(line, "```")
		case strings.HasPrefix(line, "```"):
			return out
		default:
			line, _, _ = strings.Cut(line, "#")
			_, dump, ok := strings.Cut(line, ":")
			require.True(t, ok, "dump line %q", line)
			b, err := hex.DecodeString(strings.Join(strings.Fields(dump), ""))
			require.NoError(t, err, "dump line %q", line)
			out = append(out, b...)
		}
	}
	require.Fail(t, "marker or fenced block not found", marker)
	return nil
}

// TestGoldenInDocs checks the example records of docs/wal.md against the code: the doc is
// part of the format.
func TestGoldenInDocs(t *testing.T) {
	doc, err := os.ReadFile("../../docs/wal.md")
	require.NoError(t, err)

	rec := goldenHex(t, doc, "golden record:")
	require.Equal(t, encodeRecord(7, 5, 3, []byte("hello, wal")), rec)
	h, payload, size, err := decodeRecord(rec, DefaultMaxRecordBytes)
	require.NoError(t, err)
	require.Equal(t, recordHeader{payloadBytes: 10, lsn: 7, syncedThrough: 5, kind: 3}, h)
	require.Equal(t, "hello, wal", string(payload))
	require.Equal(t, len(rec), size)

	seg := goldenHex(t, doc, "golden segment header:")
	want := make([]byte, segmentHeaderSize)
	encodeSegmentHeader(want, 7)
	require.Equal(t, want, seg)
	require.Contains(t, string(doc), segmentName(7))
}
