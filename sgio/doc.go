// Package sgio is Weft's wire protocol between a transaction node and a storage node: sparse
// scatter-gather page IO. It holds the frame format, the message types, the error codes that
// carry sentinel errors across TCP, the handshake's proofs, a gathering encoder (Writer), a
// stream decoder (Decode, ReadFrame) and a pipelined client connection (Client). It is
// mechanism without policy: no server (the storage node's gnet server uses Decode and
// Writer), no retries, no reconnects. The Commit body and the sparse segment are
// commitbody's codec, which the storage engine shares for its WAL commit records; Commit,
// Segments, ViewCommit and ViewSegments call it.
//
//	frame (24-byte header, then the body)     sparse segment (commitbody; in Commit and Segments)
//	off size field                            off size field
//	0   4    magic        'W' 'E' 'F' 'T'     0   4    table id
//	4   1    version      Version (2)         4   2    row bytes    8..4096, a multiple of 8
//	5   1    type         message type        6   2    reserved     0
//	6   2    flags        0                   8   8    page number  <= PageMax (2^58-1)
//	8   8    request id   echoed by a reply   16  8    data mask    rows that follow
//	16  4    body length  multiple of 8       24  8    clear mask   absent; data & clear == 0
//	20  4    crc32c       header 0..19, body  32  ...  popcount(data) * row bytes
//	24  ...  body
//
// Rules:
//
//   - Integers are little-endian. Reserved fields and padding are zero; nonzero flags are
//     rejected. A body is zero-padded to a multiple of 8 and every field before rows is a
//     multiple of 8 long, so rows in an 8-aligned receive buffer are 8-aligned.
//   - A receiver checks the body length against its limit (at most 64 MiB) before it
//     allocates or waits for anything.
//   - A read request names (table, page, want mask) and carries no rows; its reply carries
//     only the wanted rows that exist. The storage node takes pages below TablePagesMax.
//   - Decoding is zero-copy: a Frame's Body, a parsed Segment's Rows and a SegmentIter's
//     segments alias the buffer they came from and are valid until it is discarded or read
//     again.
//   - A Writer sends the rows of Commit and Segments messages by reference: they must not
//     change until the write has completed.
//   - Every sentinel is in errors.go; every format or checksum failure wraps
//     corrupt.ErrCorruption. An Error reply's Code (codes.go) maps back to the same
//     sentinel (ErrorFromWire): errors.Is(err, sgio.ErrTableNotFound) holds across TCP.
//
// Reasons, history and the full format: docs/wire.md.
package sgio
