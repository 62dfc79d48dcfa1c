package bench

import "encoding/binary"

// The rows of the benchmark: bytes [0, 8) hold the row's id (so a read can check that it got
// the row it asked for), bytes [8, 16) a counter that every update increments, the rest a
// pattern derived from the id. A row of 8 bytes holds only the id; its update rewrites it.

// fillRow writes the content of a new row with the given id.
func fillRow(row []byte, id uint64) {
	binary.LittleEndian.PutUint64(row, id)
	if len(row) >= 16 {
		binary.LittleEndian.PutUint64(row[8:], 0)
	}
	x := mix64(id)
	for i := 16; i+8 <= len(row); i += 8 {
		binary.LittleEndian.PutUint64(row[i:], x)
		x = x*6364136223846793005 + 1442695040888963407
	}
}

// rowMatches reports whether row is a row of the given id.
func rowMatches(row []byte, id uint64) bool {
	return binary.LittleEndian.Uint64(row) == id
}

// updateRow is the modification of the update workloads: bump the counter.
func updateRow(row []byte) error {
	if len(row) >= 16 {
		binary.LittleEndian.PutUint64(row[8:], binary.LittleEndian.Uint64(row[8:])+1)
	}
	return nil
}

// rowID returns the id a row claims to be.
func rowID(row []byte) uint64 { return binary.LittleEndian.Uint64(row) }
