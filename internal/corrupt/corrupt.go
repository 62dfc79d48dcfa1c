// Package corrupt holds the one marker that every checksum or format failure in Weft wraps.
//
// A caller asks errors.Is(err, corrupt.ErrCorruption) to tell "the bytes are bad" from every
// other failure (IO errors, closed connections, bad arguments). Decoders of frames, WAL records,
// page maps, catalogs and disk pages all report through Errorf, so the marker survives any
// amount of %w wrapping above them, and crosses TCP as the wire's corruption error code.
package corrupt

import (
	"errors"
	"fmt"
)

// ErrCorruption is the marker wrapped by every checksum or format error.
var ErrCorruption = errors.New("weft: corruption")

// Errorf formats a message and returns an error that wraps both ErrCorruption and any %w
// operands of the format.
func Errorf(format string, args ...any) error {
	return &corruptionError{err: fmt.Errorf(format, args...)}
}

type corruptionError struct{ err error }

func (e *corruptionError) Error() string { return e.err.Error() }

// Unwrap reports both the formatted cause and the marker, so errors.Is finds either.
func (e *corruptionError) Unwrap() []error { return []error{e.err, ErrCorruption} }
