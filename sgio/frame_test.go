package sgio

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/checksum"
	"github.com/weftdb/weft/internal/corrupt"
)

func TestHeaderLayout(t *testing.T) {
	frame := AppendFrame(nil, 0x1122334455667788, &IDRange{First: 1, Count: 2})
	require.Len(t, frame, HeaderSize+16)
	require.Equal(t, []byte("WEFT"), frame[0:4])
	require.Equal(t, byte(Version), frame[4])
	require.Equal(t, byte(TypeIDRange), frame[5])
	require.Equal(t, []byte{0, 0}, frame[6:8])
	require.Equal(t, uint64(0x1122334455667788), binary.LittleEndian.Uint64(frame[8:]))
	require.Equal(t, uint32(16), binary.LittleEndian.Uint32(frame[16:]))
	want := checksum.Update(checksum.Of(frame[:20]), frame[24:])
	require.Equal(t, want, binary.LittleEndian.Uint32(frame[20:]))
	require.Equal(t, len(frame), Frame{Body: frame[24:]}.Size())
}

// A stream decoder asks for the header, then the whole frame, and never for more.
func TestDecodeNeedMore(t *testing.T) {
	frame := AppendFrame(nil, 5, &Hello{Version: Version, Name: "client"})
	for cut := range len(frame) {
		_, n, err := Decode(frame[:cut], MaxBodyLimit)
		require.Same(t, ErrNeedMore, err, "cut %d", cut)
		if cut < HeaderSize {
			require.Equal(t, HeaderSize, n)
		} else {
			require.Equal(t, len(frame), n)
		}
	}
	// Two frames back to back: Decode takes the first only.
	two := append(frame, AppendFrame(nil, 6, &Ping{})...)
	f, n, err := Decode(two, MaxBodyLimit)
	require.NoError(t, err)
	require.Equal(t, len(frame), n)
	require.Equal(t, uint64(5), f.ID)
	f, n, err = Decode(two[n:], MaxBodyLimit)
	require.NoError(t, err)
	require.Equal(t, HeaderSize, n)
	require.Equal(t, TypePing, f.Type)
}

func TestDecodeRejects(t *testing.T) {
	good := func() []byte { return AppendFrame(nil, 1, &CommitAck{LSN: 1, Seq: 2}) }
	resum := func(b []byte) []byte {
		binary.LittleEndian.PutUint32(b[offCRC:], checksum.Update(checksum.Of(b[:offCRC]), b[HeaderSize:]))
		return b
	}
	cases := []struct {
		name    string
		frame   []byte
		bodyMax uint32
		is      error
		corrupt bool
	}{
		{"magic", func() []byte { b := good(); b[0] = 'w'; return b }(), MaxBodyLimit, ErrBadMagic, true},
		{"version", func() []byte { b := good(); b[offVersion] = Version + 1; return b }(), MaxBodyLimit, ErrBadVersion, false},
		{"flags", func() []byte { b := good(); b[offFlags+1] = 1; return b }(), MaxBodyLimit, ErrMalformed, true},
		{"too large", good(), 8, ErrFrameTooLarge, false},
		{"too large for protocol", func() []byte {
			b := good()
			binary.LittleEndian.PutUint32(b[offBodyLen:], MaxBodyLimit+8)
			return b
		}(), ^uint32(0), ErrFrameTooLarge, false},
		{"unaligned length", func() []byte {
			b := append(good(), 0)
			binary.LittleEndian.PutUint32(b[offBodyLen:], 17)
			return resum(b)
		}(), MaxBodyLimit, ErrMalformed, true},
		{"body checksum", func() []byte { b := good(); b[HeaderSize+3] ^= 1; return b }(), MaxBodyLimit, ErrChecksum, true},
		{"header checksum", func() []byte { b := good(); b[offID] ^= 1; return b }(), MaxBodyLimit, ErrChecksum, true},
		{"crc field", func() []byte { b := good(); b[offCRC] ^= 1; return b }(), MaxBodyLimit, ErrChecksum, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := Decode(c.frame, c.bodyMax)
			require.ErrorIs(t, err, c.is)
			require.Equal(t, c.corrupt, isCorrupt(err), "%v", err)
			// Header failures are found with the header alone, before waiting for the body.
			if c.is != ErrChecksum {
				_, _, err = Decode(c.frame[:HeaderSize], c.bodyMax)
				require.ErrorIs(t, err, c.is)
			}
		})
	}
}

func isCorrupt(err error) bool { return err != nil && errors.Is(err, corrupt.ErrCorruption) }

// An unknown type in an intact frame is reported with the frame, so a server can answer it
// and go on.
func TestDecodeUnknownType(t *testing.T) {
	b := AppendFrame(nil, 42, &Ping{})
	b[offType] = 0x7e
	binary.LittleEndian.PutUint32(b[offCRC:], checksum.Update(checksum.Of(b[:offCRC]), b[HeaderSize:]))
	f, n, err := Decode(append(b, 1, 2, 3), MaxBodyLimit)
	require.ErrorIs(t, err, ErrUnknownType)
	require.ErrorIs(t, err, ErrUnsupported)
	require.False(t, isCorrupt(err))
	require.Equal(t, CodeUnsupported, CodeOf(err))
	require.Equal(t, len(b), n)
	require.Equal(t, uint64(42), f.ID)
	require.Equal(t, Type(0x7e), f.Type)
}

func TestDecodeMaxBodyBoundary(t *testing.T) {
	m := &PageDirReply{Entries: make([]PageEntry, 3)} // 64-byte body
	frame := AppendFrame(nil, 1, m)
	_, _, err := Decode(frame, 64)
	require.NoError(t, err)
	_, _, err = Decode(frame, 63)
	require.ErrorIs(t, err, ErrFrameTooLarge)
	_, _, err = Decode(AppendFrame(nil, 1, &Ping{}), 0)
	require.NoError(t, err, "an empty body fits any limit")
}
