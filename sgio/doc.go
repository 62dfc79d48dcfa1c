// Package sgio is Weft's wire protocol between a transaction node and a storage node: sparse
// scatter-gather page IO. It holds the frame format, the message types, sparse segments, the
// error codes that carry sentinel errors across TCP, the handshake's proofs, a gathering
// encoder (Writer), a stream decoder (Decode, ReadFrame) and a pipelined client connection
// (Client). It is mechanism without policy: no server (the storage node's gnet server uses
// Decode and Writer), no retries, no reconnects. docs/wire.md is the format's reference.
//
// # Frames
//
// All integers are little-endian. A frame is a 24-byte header and a body:
//
//	off size field
//	0   4    magic        'W' 'E' 'F' 'T'
//	4   1    version      1
//	5   1    type         message type (Type)
//	6   2    flags        0 (reserved; nonzero is rejected)
//	8   8    request id   a reply carries its request's id
//	16  4    body length  a multiple of 8, at most the receiver's limit (<= 64 MiB)
//	20  4    crc32c       Castagnoli, over header bytes 0..19 then the body
//	24  ...  body
//
// A body is zero-padded to a multiple of 8 bytes, and every field that precedes rows is a
// multiple of 8 bytes long, so a receiver that consumes whole frames from an 8-aligned buffer
// (bufio.Reader, gnet's inbound buffer) sees every row 8-aligned. The receiver checks the body
// length against its limit before it allocates or waits for anything.
//
// # Sparse segments
//
// The unit of IO in both directions is a sparse segment: one logical page (64 rows) of one
// table, a data mask whose rows follow in slot order and a clear mask of rows that are absent.
// A read request names (table, page, want mask) and carries no rows; its reply carries only
// the wanted rows that exist.
//
//	off size field
//	0   4    table id
//	4   2    row bytes    8..4096, a multiple of 8
//	6   2    reserved     0
//	8   8    page number  <= PageMax (2^58-1); the storage node takes < TablePagesMax (2^30)
//	16  8    data mask    rows that follow
//	24  8    clear mask   rows that are absent; data & clear == 0
//	32  ...  popcount(data) * row bytes
//
// # Lifetimes
//
// Decoding is zero-copy: a Frame's Body, a parsed Segment's Rows and a SegmentIter's segments
// alias the buffer they were decoded from, and are valid until that buffer is discarded or
// read again. Encoding gathers: a Writer sends the rows of Commit and Segments messages by
// reference, so they must not change until the write has completed.
//
// # Errors
//
// Every sentinel error is in errors.go; every format or checksum failure wraps
// corrupt.ErrCorruption. An Error reply carries a Code (codes.go) that maps back to the same
// sentinel on the other side (ErrorFromWire), so errors.Is(err, sgio.ErrTableNotFound) holds
// for an error that crossed TCP.
package sgio
