package logicpage

import "errors"

// Errors returned when a geometry is built (a bad table definition: an operating error, not
// corruption).
var (
	// ErrRowSize reports a row size outside RowBytesMin..RowBytesMax or not a multiple of
	// RowBytesAlign.
	ErrRowSize = errors.New("logicpage: bad row size")
)

// Errors returned when a segment is checked (bytes that came off the wire, out of the WAL or a
// data file). Each is returned wrapped by corrupt.Errorf, so errors.Is finds both the sentinel
// and corrupt.ErrCorruption.
var (
	// ErrSegment reports a sparse segment whose masks, page number or row bytes are
	// inconsistent.
	ErrSegment = errors.New("logicpage: bad segment")
)
