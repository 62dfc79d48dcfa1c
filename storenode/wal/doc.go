// Package wal is the write-ahead log of the storage node: segment files of checksummed
// records, written by one goroutine with group commit, and recovered on Open with a torn tail
// told apart from corruption. The log is generic: a record is an opaque payload with a kind
// byte chosen by the storage engine (commit batch, table creation, id grant, ownership grant,
// ...). Records have LSNs 1, 2, 3, ... (a record count, not a byte offset). A log is a
// directory of segment files named wal-<first LSN, 16 lowercase hex digits>.log, plus the
// lock file LOCK. All integers are little-endian; docs/wal.md has the same layout and a
// golden record (TestGoldenInDocs checks it).
//
//	segment file
//	+----------------+--------+--------+-----+--------+----------------------------+
//	| segment header | record | record | ... | record | (preallocated space, zero) |
//	+----------------+--------+--------+-----+--------+----------------------------+
//	 32 bytes          each 8-byte aligned
//
//	segment header (32 bytes)
//	 0  u32 magic "WWAL" (0x4c415757)
//	 4  u32 version (1)
//	 8  u64 first LSN (equals the LSN in the file name)
//	16  12  reserved, zero
//	28  u32 CRC32C of bytes [0, 28)
//
//	record (32-byte header, payload, zero padding to a multiple of 8)
//	 0  u32 payload length n (without padding), <= MaxRecordBytes
//	 4  u32 CRC32C of bytes [0, 4) and [8, 32 + pad8(n))
//	 8  u64 LSN, >= 1
//	16  u64 synced-through: the highest LSN durable when the record was written, < LSN
//	24  u8  kind
//	25  7   reserved, zero
//	32  n   payload
//	    pad8(n)-n zero bytes
//
// An all-zero record header is the end of the written records. The active segment's blocks
// are reserved a few MiB ahead of the writes (fallocate KEEP_SIZE; advisory).
//
// Rules:
//
//   - Records are consecutive: record k+1 follows record k, in the same segment or as the
//     first record of the next one, whose name carries its LSN.
//   - A record is acknowledged (its done callback gets nil, Append returns its LSN) only
//     after its bytes were written, and, with SyncAlways or force, synced.
//   - A segment is rolled only after its last record was synced, and a new segment's
//     directory entry is synced before any record in it is acknowledged: only the newest
//     segment can have a torn tail after a clean history.
//   - The synced-through field of a record never claims more than was durable, so a bad
//     record followed by a valid record whose synced-through covers it had been durable:
//     that is corruption, not a torn write.
//   - After a failed write or fsync the WAL is fail-stop: it acknowledges nothing more and
//     never retries an fsync. Reopening recovers.
//   - Open and the replay callback run on the caller's goroutine; every method of WAL may be
//     called from any goroutine. The done callbacks of AppendAsync and AppendPiecesAsync run
//     on the one writer goroutine, in LSN order: they must be quick and must not call
//     Append, AppendBatch, Sync, DropBefore or Close, which wait for it (AppendAsync is fine).
//   - Append and AppendAsync copy the payload during the call. AppendPiecesAsync copies the
//     pieces without Keep and writes the kept ones from the caller's memory: a kept piece
//     must not change until its record's done has run.
//
// Reasons, history and measurements: docs/wal.md.
package wal
