package sgio

import (
	"encoding/binary"
	"fmt"

	"github.com/weftdb/weft/commitbody"
	"github.com/weftdb/weft/internal/checksum"
	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/logicpage"
)

// Frame layout and limits. Part of the format; do not change.
const (
	// Magic is the first four bytes of every frame, 'W' 'E' 'F' 'T', read as a little-endian
	// uint32.
	Magic uint32 = 'W' | 'E'<<8 | 'F'<<16 | 'T'<<24
	// Version is the protocol version this package speaks, in every frame header and in Hello.
	Version = 2
	// HeaderSize is the size of a frame header; the body follows it.
	HeaderSize = 24
	// BodyAlign is the alignment of every body length: bodies are zero-padded to a multiple of
	// 8 bytes, so every frame is too, and a receiver that consumes whole frames from an
	// 8-aligned buffer sees every body, and every row in it, 8-aligned.
	BodyAlign = 8
	// MaxBodyLimit is the hard protocol maximum of a body length; a receiver may configure a
	// lower maximum. It is the largest Commit body (commitbody.BodyBytesMax), the bound the
	// storage engine's WAL commit records share.
	MaxBodyLimit = commitbody.BodyBytesMax

	// RowsPerPage is the number of rows in a logical page: one bit per slot in a uint64 mask.
	// It, PageMax, TablePagesMax and the row size bounds are logicpage's, the one definition
	// of the page geometry.
	RowsPerPage = logicpage.RowsPerPage
	// PageMax is the largest page number a message can carry: the page of row id
	// math.MaxUint64; a larger one is malformed.
	PageMax = logicpage.PageMax
	// TablePagesMax is the number of pages a table may have (2^30): the storage node answers
	// a page number from TablePagesMax to PageMax with ErrMalformed.
	TablePagesMax = logicpage.TablePagesMax
	// RowBytesMin and RowBytesMax bound a table's row size, which is also a multiple of 8.
	RowBytesMin = logicpage.RowBytesMin
	RowBytesMax = logicpage.RowBytesMax
	// SegmentHeaderSize is the size of a sparse segment's header; its rows follow it
	// (commitbody's format).
	SegmentHeaderSize = commitbody.SegmentHeaderBytes

	// NameMax is the longest table, stat or client name.
	NameMax = 64
	// ErrorMessageMax is the longest message of an Error reply.
	ErrorMessageMax = 1024
	// NonceSize and ProofSize are the sizes of the handshake's nonces and HMAC-SHA256 proofs.
	NonceSize = 32
	ProofSize = 32

	// Offsets of the header fields.
	offMagic   = 0
	offVersion = 4
	offType    = 5
	offFlags   = 6
	offID      = 8
	offBodyLen = 16
	offCRC     = 20
)

// Frame is one decoded frame: its type, its request id and its body. Body aliases the buffer the
// frame was decoded from (Decode's buf, a bufio.Reader's buffer, a gnet Peek): it is valid only
// until that buffer is discarded, overwritten or read again.
type Frame struct {
	// Type is the message type of the body.
	Type Type
	// ID is the request id; a reply carries its request's id.
	ID uint64
	// Body is the message body, a multiple of BodyAlign bytes.
	Body []byte
}

// Size reports the frame's length on the wire: HeaderSize plus the body.
func (f Frame) Size() int { return HeaderSize + len(f.Body) }

// putHeader writes a frame header for a body of bodyLen bytes into hdr, with a zero CRC.
func putHeader(hdr []byte, t Type, id uint64, bodyLen int) {
	_ = hdr[HeaderSize-1]
	binary.LittleEndian.PutUint32(hdr[offMagic:], Magic)
	hdr[offVersion] = Version
	hdr[offType] = byte(t)
	binary.LittleEndian.PutUint16(hdr[offFlags:], 0)
	binary.LittleEndian.PutUint64(hdr[offID:], id)
	binary.LittleEndian.PutUint32(hdr[offBodyLen:], uint32(bodyLen))
	binary.LittleEndian.PutUint32(hdr[offCRC:], 0)
}

// headerCRC starts a frame's CRC: the header bytes before the CRC field.
func headerCRC(hdr []byte) uint32 { return checksum.Of(hdr[:offCRC]) }

// Decode decodes the frame at the start of buf, checking the header against bodyMax (clamped
// to MaxBodyLimit) before it waits for or looks at the body, then the CRC. It allocates
// nothing: the returned Frame's Body aliases buf.
//
// On success n is the frame's length: the caller discards n bytes when done with the frame.
// When buf holds less than a whole frame, err is exactly ErrNeedMore and n is the number of
// bytes buf must hold before Decode can go further (HeaderSize, then the whole frame); a
// stream reader peeks n bytes (bufio.Reader.Peek, gnet Conn.Peek) and calls Decode again.
//
// On ErrUnknownType the frame is intact (its checksum held): the Frame carries its type and id
// and n its length, so a server can reply CodeUnsupported, discard n bytes and go on. Every
// other error means the stream cannot be trusted past this point: reply with CodeOf(err) if
// the peer may still read, then close the connection. Format and checksum failures wrap
// corrupt.ErrCorruption.
//
// Decode may be called from any goroutine; it keeps no state.
func Decode(buf []byte, bodyMax uint32) (f Frame, n int, err error) {
	if len(buf) < HeaderSize {
		return Frame{}, HeaderSize, ErrNeedMore
	}
	if m := binary.LittleEndian.Uint32(buf[offMagic:]); m != Magic {
		return Frame{}, 0, corrupt.Errorf("sgio: frame magic %#08x, want %#08x: %w", m, Magic, ErrBadMagic)
	}
	if v := buf[offVersion]; v != Version {
		return Frame{}, 0, fmt.Errorf("sgio: frame version %d, this side speaks %d: %w", v, Version, ErrBadVersion)
	}
	if fl := binary.LittleEndian.Uint16(buf[offFlags:]); fl != 0 {
		return Frame{}, 0, fmt.Errorf("sgio: frame flags %#04x, reserved and must be 0: %w", fl, ErrMalformed)
	}
	if bodyMax > MaxBodyLimit {
		bodyMax = MaxBodyLimit
	}
	bodyLen := binary.LittleEndian.Uint32(buf[offBodyLen:])
	if bodyLen > bodyMax {
		return Frame{}, 0, fmt.Errorf("sgio: frame body of %d bytes, limit %d: %w", bodyLen, bodyMax, ErrFrameTooLarge)
	}
	if bodyLen%BodyAlign != 0 {
		return Frame{}, 0, fmt.Errorf("sgio: frame body of %d bytes, not a multiple of %d: %w", bodyLen, BodyAlign, ErrMalformed)
	}
	n = HeaderSize + int(bodyLen)
	if len(buf) < n {
		return Frame{}, n, ErrNeedMore
	}
	body := buf[HeaderSize:n:n]
	crc := checksum.Update(headerCRC(buf), body)
	if want := binary.LittleEndian.Uint32(buf[offCRC:]); crc != want {
		return Frame{}, 0, corrupt.Errorf("sgio: frame crc32c %#08x, header says %#08x: %w", crc, want, ErrChecksum)
	}
	f = Frame{Type: Type(buf[offType]), ID: binary.LittleEndian.Uint64(buf[offID:]), Body: body}
	if !f.Type.Known() {
		return f, n, fmt.Errorf("sgio: frame type %#02x (request id %d): %w", byte(f.Type), f.ID, ErrUnknownType)
	}
	return f, n, nil
}

// AppendFrame appends one whole frame holding m, with request id id, to dst and returns the
// extended slice. It copies every byte, row bytes included: for many frames, or rows to send
// by reference, use a Writer. m must be valid (m.Validate() == nil); AppendFrame panics if m's
// encoding disagrees with its BodySize.
func AppendFrame(dst []byte, id uint64, m Message) []byte {
	size := m.BodySize()
	start := len(dst)
	dst = append(dst, make([]byte, HeaderSize)...)
	dst = m.AppendBody(dst)
	checkBodySize(m, size, len(dst)-start-HeaderSize)
	hdr := dst[start : start+HeaderSize]
	putHeader(hdr, m.Type(), id, size)
	binary.LittleEndian.PutUint32(hdr[offCRC:], checksum.Update(headerCRC(hdr), dst[start+HeaderSize:]))
	return dst
}
