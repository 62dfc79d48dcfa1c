package hashindex

import "errors"

// Errors of the hash index, grouped by when they occur. Format failures (a bad checksum, a
// foreign or damaged table) wrap corrupt.ErrCorruption instead, and errors of the table
// underneath arrive as txnode's sentinels (txnode.ErrConflict, txnode.ErrClosed, ...).
var (
	// ErrUniqueViolation is returned by Insert on a unique index when the key already has
	// an id (whatever id it is).
	ErrUniqueViolation = errors.New("hashindex: unique key already indexed")
	// ErrEntryExists is returned by Insert on a non-unique index when the key already maps
	// to that very id.
	ErrEntryExists = errors.New("hashindex: entry already indexed")
	// ErrNotFound is returned by Lookup for a key with no id, and by Delete for an entry
	// (key, id) the index does not hold.
	ErrNotFound = errors.New("hashindex: key not found")
	// ErrKeySize is returned for a key whose length is not the index's key size.
	ErrKeySize = errors.New("hashindex: key size does not match the index")
	// ErrOptions is returned by Create for options out of range.
	ErrOptions = errors.New("hashindex: invalid options")
)
