package cluster

import (
	"errors"
	"fmt"
)

// Errors of the cluster package, grouped by when they occur. Each reads "cluster: ...". A
// malformed value read from etcd wraps corrupt.ErrCorruption instead.
var (
	// Arguments.

	// ErrInvalid is returned for a bad argument: a table name, a layout, an address.
	ErrInvalid = errors.New("cluster: invalid argument")

	// Talking to etcd.

	// ErrUnavailable wraps every error of the etcd client, with its cause: etcd down, no
	// leader, a timeout, or a request etcd refused (auth, limits). A write may or may not
	// have happened in etcd, except where a doc says otherwise.
	ErrUnavailable = errors.New("cluster: etcd unavailable")

	// The partition map.

	// ErrTableExists is returned by CreateTable for a name the map already has.
	ErrTableExists = errors.New("cluster: table already exists")
	// ErrTableNotFound is returned for a table the map does not have.
	ErrTableNotFound = errors.New("cluster: table not found")
	// ErrMapChanged is returned by SwitchPartition when the partition's entry is no longer
	// the one the caller read (its revision moved): nothing was changed; read again.
	ErrMapChanged = errors.New("cluster: partition map changed")

	// Ownership.

	// ErrOwned is returned by Acquire when another session holds the partition; the error is
	// an *OwnedError naming the holder.
	ErrOwned = errors.New("cluster: partition owned by another node")
	// ErrLapsed is returned by Check while the session cannot prove its lease is alive (its
	// last keepalive plus TTL minus the margin has passed). It may pass: a later keepalive
	// that proves the lease alive, and the owner keys intact, ends it.
	ErrLapsed = errors.New("cluster: ownership lapsed: no proof the lease is alive")
	// ErrLost is returned by Check once an ownership ended for good: released, its owner key
	// deleted or granted to another, or its session's lease gone.
	ErrLost = errors.New("cluster: ownership lost")
	// ErrSessionClosed is returned by a closed session's methods and, with ErrLost, by the
	// Check of its ownerships.
	ErrSessionClosed = errors.New("cluster: session closed")
)

// Holder describes the holder of a partition as its owner key says: the value a node that is
// not the owner needs to route a write to it (txnode's ErrNotOwner will carry Addr).
type Holder struct {
	// Owner is the holder's owner id (txnode.Options.OwnerID).
	Owner uint64
	// Incarnation is the holder's random instance id.
	Incarnation [16]byte
	// Addr is where the holder takes requests for the partition (may be empty).
	Addr string
	// Epoch is the holder's grant revision.
	Epoch uint64
	// WriteBack is set for a holder that acknowledges writes before they are durable
	// (txnode WriteBack): a move asks it to flush before the freeze (moveflush.go).
	WriteBack bool
}

// OwnedError is the error of an Acquire that found the partition held by another session.
// It matches ErrOwned under errors.Is.
type OwnedError struct {
	Table  string
	Part   uint32
	Holder Holder
}

func (e *OwnedError) Error() string {
	return fmt.Sprintf("cluster: table %q partition %d is owned by owner %d at %q (epoch %d)",
		e.Table, e.Part, e.Holder.Owner, e.Holder.Addr, e.Holder.Epoch)
}

// Unwrap makes errors.Is(err, ErrOwned) hold.
func (e *OwnedError) Unwrap() error { return ErrOwned }

// unavailable wraps an etcd client error of op as ErrUnavailable, keeping the cause.
func unavailable(op string, err error) error {
	return fmt.Errorf("cluster: %s: %w: %w", op, ErrUnavailable, err)
}
