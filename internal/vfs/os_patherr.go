//go:build darwin || windows

package vfs

import (
	"errors"
	"os"
)

// unwrapPath returns the error inside an *os.PathError, so that the caller's own PathError
// does not nest another (the darwin and windows sync calls wrap theirs).
func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
