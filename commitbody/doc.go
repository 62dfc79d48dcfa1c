// Package commitbody is the one codec of a commit batch's bytes: the Commit body that the wire
// (sgio) carries and the storage engine (storenode) logs as its WAL commit record, byte for
// byte, and the sparse segment it is made of (which sgio's Segments replies carry too). The
// batch, its fences and its segments are base's nouns; this package encodes and decodes them.
//
//	Commit body                                 sparse segment
//	off size field                              off size field
//	0   8    owner id                           0   4    table id
//	8   8    seq                                4   2    row bytes    8..4096, a multiple of 8
//	16  4    fence count                        6   2    reserved     0
//	20  4    segment count                      8   8    page number  <= PageMax (2^58-1)
//	24  16*n fences {table u32,                 16  8    data mask    rows that follow
//	         reserved u32, epoch u64}           24  8    clear mask   absent; data & clear == 0
//	...      segments, back to back             32  ...  popcount(data) * row bytes
//
// Rules:
//
//   - Integers are little-endian; reserved fields are zero. Every part is a multiple of 8
//     bytes long, so a body needs no padding and rows in an 8-aligned buffer are 8-aligned.
//   - Decode checks a whole body before it hands out anything: the counts against the bytes
//     left, before any element is read; every fence's and segment's reserved fields and
//     segment header rules; rows of exactly popcount(data) * row bytes; nothing after the
//     last segment.
//   - Decoding copies and allocates nothing (except an error): a View's fences and segments
//     alias the body and are valid as long as it is.
//   - The encoders check nothing: ValidateSegment and ValidateSegmentRows check a segment
//     before it is encoded.
//   - Every failure wraps base.ErrMalformed (and so corrupt.ErrCorruption), and
//     base.ErrTruncated or base.ErrBadRowSize where they fit.
//   - It imports none of Weft's packages but base, logicpage (the page geometry's one
//     definition) and internal/ ones, so the engine shares it with the wire without importing
//     the wire (.ci/run checks both).
//
// Reasons and the layering: docs/architecture.md; the format: docs/wire.md, "Writes" and
// "Sparse segment"; the commit record around it: docs/storage.md.
package commitbody
