package repl

import "errors"

// Errors of the log store.
var (
	// ErrBadEntry is wrapped by Append for an entry the log store cannot hold: term or index
	// 0, a ConfChange of version 1, or a normal entry whose Data is not an entry header and
	// an engine payload (EncodeEntryData).
	ErrBadEntry = errors.New("repl: bad entry")
	// ErrBadAppend is wrapped by Append and Compact for a call raft never makes: entries
	// that are not consecutive, that leave a gap after the last index, a compaction past the
	// last index.
	ErrBadAppend = errors.New("repl: bad append")
	// ErrClosed is returned by every call after Close.
	ErrClosed = errors.New("repl: log store closed")
)
