package testkit

import "encoding/binary"

// Row64 returns a new 64-byte row whose eight little-endian words are v, v+1, ..., v+7: the
// row of the engine's tests, telling every row and every word apart.
func Row64(v uint64) []byte {
	b := make([]byte, 64)
	for i := range 8 {
		binary.LittleEndian.PutUint64(b[i*8:], v+uint64(i))
	}
	return b
}
