// Package checksum is the one checksum of Weft's formats: CRC32C (Castagnoli), which amd64 and
// arm64 compute in hardware. Frames, WAL records, page-map entries, catalogs and serialised
// bitmap-trees all use it, so one table serves every package.
package checksum

import "hash/crc32"

var table = crc32.MakeTable(crc32.Castagnoli)

// Of returns the CRC32C of b.
func Of(b []byte) uint32 { return crc32.Checksum(b, table) }

// Update returns the CRC32C of the bytes summarised by crc followed by b, so a checksum can be
// computed over gathered slices without copying them together.
func Update(crc uint32, b []byte) uint32 { return crc32.Update(crc, table, b) }
