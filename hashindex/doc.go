// Package hashindex is a hash index over a linear table: secondary lookups from a fixed-size
// key (a player name, an item kind) to row ids, kept by linear hashing in an auto-increment
// txnode table of its own and changed only by transactions over it. An index is unique (one
// id a key) or not (a set of ids a key). It depends only on txnode's public API, so it works
// on the embedded store and a storage node alike; Open finds it again after a restart.
//
//   - An index changes in the caller's transaction: a row and its index entry commit
//     together or not at all. Every lookup and change is a Tx read or write, so OCC makes it
//     serializable: of two concurrent unique inserts of one key only one commits.
//   - TxLookup, TxInsert, TxDelete and TxIDs run in the caller's transaction, on its
//     goroutine. Insert and Delete run DB.Update (retried on conflict); Lookup is
//     linearizable; IDs reads each row consistent, the sequence not a snapshot (like
//     Table.Scan; TxIDs is one). An Index is safe for concurrent use.
//   - Keys are exactly KeyBytes long (ErrKeySize) and are not retained. A second insert of
//     a key into a unique index fails with ErrUniqueViolation; of a (key, id) already held
//     by a non-unique one, with ErrEntryExists.
//   - A Tx form failing with ErrUniqueViolation, ErrEntryExists, ErrNotFound or ErrKeySize
//     wrote nothing; any other error may leave partial index writes: roll back, never commit.
//   - A transaction keeps the pages it read cached until it ends: an operation on a chain
//     longer than the cache holds, and Verify (one transaction), fail with
//     txnode.ErrCacheFull. Size the cache for them.
//   - Write an index's table only through this package: a cache-hit Lookup checks a row's
//     CRC32C once per txnode row version, not on every read.
//   - Only splits write the header, so inserts into different buckets do not conflict;
//     lookups never read it. A primary row never moves and buckets are never removed: the
//     directory is append-only and the index never shrinks.
//
// Format version 1 (constants in format.go). Rows are R bytes (a multiple of 8, 64..4096),
// integers little-endian. The header is the table's first row (the lowest id, never deleted):
//
//	off size header row                     off size every other row
//	  0    4 CRC32C of bytes [4, 64)          0    4 CRC32C of salt, then [4, 24+count*entry)
//	  4    4 magic "WFHX"                     4    1 kind: 1 bucket, 2 overflow, 3 directory
//	  8    2 format version (1)               5    1 level (bucket rows; 0 otherwise)
//	 10    2 key bytes (1..256)               6    2 count of entries
//	 12    2 flags: bit 0 unique, others 0    8    8 bucket number, or directory row number
//	 14    2 reserved, 0                     16    8 next row id (overflow, directory), 0 none
//	 16    8 salt (hash and row checksums)   24  ... entries, then zero (not read):
//	 24    8 n, the bucket count (>= 1)               bucket, overflow: count * (key | id [8])
//	 32    8 id of directory row 0                    directory: count * primary id [8];
//	 40    8 id of the last directory row             row d holds buckets d*((R-24)/8)...
//	 48    8 directory rows, ceil(n/((R-24)/8))
//	 56    8 reserved, 0; then zero to R
//
// Invariants of the format, all checked by Verify:
//
//   - With 2^L <= n < 2^(L+1), key hash h is in bucket h mod 2^L, or h mod 2^(L+1) when that
//     is below n-2^L. Buckets below n-2^L and from 2^L are at level L+1, the others at L;
//     every entry of a bucket's chain has mask(hash, level) = the bucket number.
//   - Id 0 never names a next row; an overflow row holds at least one entry. The hash is
//     keyHash, salted by the index's random salt. A format failure wraps
//     corrupt.ErrCorruption.
//
// Reasons, history and measurements: docs/hashindex.md.
package hashindex
