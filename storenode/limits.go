package storenode

import (
	"errors"
	"syscall"
)

// File descriptors. Each live table (and each dropped one until a checkpoint removes it) keeps
// its data file open (OpenFiles: a server's start-up check counts them, storenode/server's
// limits.go). CreateTable refuses a table beyond Options.MaxTables (ErrTooManyTables), and a
// data file open that fails with EMFILE or ENFILE fails that CreateTable only, with
// ErrTooManyTables; the engine goes on.

// openFiles reports the data files the engine keeps open: its tables and the dropped ones a
// checkpoint has not removed yet.
func (e *Engine) openFiles() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.tables) + len(e.dropped)
}

// isFileLimit reports whether err is a failed open for want of file descriptors.
func isFileLimit(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}
