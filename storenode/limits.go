package storenode

import (
	"errors"
	"math/bits"
	"syscall"

	"github.com/weftdb/weft/logicpage"
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

// Granted ids. A commit may write only rows whose ids were granted (Commit refuses the rest
// with ErrMalformed): the page map and the cache grow with the pages commits name, so one row
// far past the grants would cost memory and meta bytes up to its page. Replay refuses such a
// commit record too, as corruption: grants are logged (and synced) before the ids are
// returned, so in a WAL written by the engine every commit record follows the grant of every
// id it names; a record that names a page past them was forged or damaged.

// segmentLastID returns the highest row id segment s names: its highest data or clear slot,
// or the page's first id for an empty segment (which still dirties its page).
func segmentLastID(page, data, clear uint64) uint64 {
	last := page * logicpage.RowsPerPage
	if slots := data | clear; slots != 0 {
		last += uint64(63 - bits.LeadingZeros64(slots))
	}
	return last
}
