package bitmaptree

import "errors"

// Errors of Unmarshal and UnmarshalBinary. Each is returned wrapped together with
// corrupt.ErrCorruption and a detail, so callers test either with errors.Is: the marker to
// tell bad bytes from other failures, the sentinel to tell which check failed.
var (
	// ErrChecksum reports that the CRC32C stored in the header does not match the bytes.
	ErrChecksum = errors.New("bitmaptree: checksum mismatch")
	// ErrVersion reports a format version this code does not read (a newer writer, or bad
	// bytes that happen to carry the right magic).
	ErrVersion = errors.New("bitmaptree: unsupported format version")
	// ErrFormat reports any other malformed encoding: bad magic or flags, a length that
	// disagrees with the input, a run that is empty, unknown or out of bounds, positions out
	// of order, trailing bytes, or a count that disagrees with the bits.
	ErrFormat = errors.New("bitmaptree: malformed encoding")
)
