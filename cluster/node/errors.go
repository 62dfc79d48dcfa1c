package node

import (
	"errors"
	"fmt"

	"github.com/weftdb/weft/cluster"
)

// Errors of package node, grouped by when they occur. Each reads "node: ...". Errors of the
// layers below come through wrapped: cluster's (etcd), txnode's and storenode's (a row, a
// storage node).
var (
	// Opening and creating.

	// ErrClosed is returned by the methods of a closed Node.
	ErrClosed = errors.New("node: closed")
	// ErrIncomplete is returned by OpenTable and Own for a table whose partition map is in
	// etcd but one of whose partition tables is missing on its storage node: a CreateTable
	// that stopped between its two steps. CreateTable with the same arguments completes it.
	ErrIncomplete = errors.New("node: table incompletely created (run CreateTable again to complete it)")

	// Routing.

	// ErrNotOwner is returned for a write (or, inside a read-write transaction, any access)
	// to a partition this node does not own. The error is a *NotOwnerError naming the holder
	// (its address, where the game routes the request), when there is one.
	ErrNotOwner = errors.New("node: partition not owned by this node")

	// Committing.

	// ErrAborted is wrapped by the error of a two-phase commit (an Update writing on several
	// storage nodes) that failed at its prepare step: a storage node refused a prepare
	// (txnode.ErrTxnBusy, txnode.ErrFenced, ..., wrapped too), or a prepare's answer was lost.
	// The coordinator never decides commit after a failed prepare, so the transaction
	// aborted: nothing of it is applied, and the error never matches
	// txnode.ErrUnknownOutcome. A prepare refused because a partition is being moved
	// (txnode.ErrMoved) is a *NotOwnerError wrapping it (retry the Update).
	ErrAborted = errors.New("node: transaction aborted")
)

// NotOwnerError is ErrNotOwner with the partition and its holder as etcd has it (a
// linearizable read of the owner key when the error was made: the holder may have changed
// since). It matches ErrNotOwner under errors.Is, and the lookup's failure too when there was
// one.
type NotOwnerError struct {
	Table string
	Part  uint32
	// Held says whether a node holds the partition; Holder is it (Holder.Addr: where it
	// takes requests, SessionConfig.Addr).
	Held   bool
	Holder cluster.Holder
	// Lookup is the failure of the holder's lookup (etcd unreachable), when there was one.
	Lookup error
}

func (e *NotOwnerError) Error() string {
	switch {
	case e.Lookup != nil:
		return fmt.Sprintf("node: table %q partition %d is not owned by this node (its holder is unknown: %v)", e.Table, e.Part, e.Lookup)
	case !e.Held:
		return fmt.Sprintf("node: table %q partition %d is not owned by this node, nor by any other (Table.Own or OwnWait it first)", e.Table, e.Part)
	}
	return fmt.Sprintf("node: table %q partition %d is owned by owner %d at %q (epoch %d), not by this node",
		e.Table, e.Part, e.Holder.Owner, e.Holder.Addr, e.Holder.Epoch)
}

// Unwrap makes errors.Is(err, ErrNotOwner) hold, and errors.Is of the lookup's failure.
func (e *NotOwnerError) Unwrap() []error {
	if e.Lookup != nil {
		return []error{ErrNotOwner, e.Lookup}
	}
	return []error{ErrNotOwner}
}
