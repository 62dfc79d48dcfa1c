package storenode

import (
	"context"
	"errors"
	"fmt"
)

// A partition's cluster table on a storage node the partition map does not place it on
// (docs/cluster.md, "Partition tables the map does not place here"). Invariants:
//
//   - A client creates a partition's cluster table only on the node etcd's map places the
//     partition on (VerifyClusterCreate, asked by the server for a client's
//     CreateClusterTable): another node's copy of another row size would make every move of
//     the partition to this node roll back, and nobody could drop it while the table is
//     mapped. An operator's creation (the mover's target of a move) is not checked.
//   - An operator drops a partition's cluster table the map does not place here, with no
//     move state and no move of the partition from or to this node recorded
//     (DropMisplacedTable); what the map places here is dropped as before (DropTable).
//   - Both read the map through the MoveVerifier (one linearizable read, in a grant
//     verification slot, bounded by GrantVerifyTimeout), "here" being the address the map
//     names this node by (the server's, as for a move step). A node without a GrantVerifier
//     checks nothing; one whose GrantVerifier is no MoveVerifier allows the creation (it
//     cannot say, as before) and refuses DropMisplacedTable.

// VerifyClusterCreate returns nil when a client may create cluster table name, partition
// part of its partitioned table, on this node: etcd's map places that partition here
// (self), or the node has no GrantVerifier, or its GrantVerifier cannot read the map (no
// MoveVerifier). A map that places it elsewhere or nowhere, or a name etcd cannot hold,
// wraps ErrFenced; etcd unreachable or slow is ErrGrantUnverified; self "" (this node does
// not know its address) is ErrNoVerifier. conn is the requesting connection (its
// verification slots). No lock held; it waits for etcd.
func (e *Engine) VerifyClusterCreate(ctx context.Context, name string, part uint32, self string, conn uint64) error {
	if e.opts.GrantVerifier == nil {
		return nil
	}
	mv, ok := e.opts.GrantVerifier.(MoveVerifier)
	if !ok {
		return nil
	}
	base, ok := clusterTableName(name, part)
	if !ok {
		return nil // not a partition table's name: CreateClusterTable refuses it
	}
	if self == "" {
		return fmt.Errorf("%w: create cluster table %q: this storage node does not know its address", ErrNoVerifier, name)
	}
	v, err := e.moveView(ctx, conn, mv, base, part)
	switch {
	case err != nil: // ErrFenced: a name etcd cannot hold
		return fmt.Errorf("create cluster table %q: %w", name, err)
	case v.Node != self:
		return fmt.Errorf("%w: create cluster table %q: etcd's partition map places partition %d of %q on %q, not on this node (%s)",
			ErrFenced, name, part, base, v.Node, self)
	}
	return nil
}

// DropMisplacedTable drops cluster table name for an operator when etcd's map does not place
// its partition on this node (self) and no move of it from or to this node is recorded, the
// table having no move state here (see the file's invariants): its holder, if any, is not
// asked. ErrTableOwned when the map places it here or a move concerns it, ErrGrantUnverified
// when etcd did not answer, ErrNoVerifier when the node cannot ask (no MoveVerifier, self
// ""). No lock held across the read of etcd.
func (e *Engine) DropMisplacedTable(ctx context.Context, name, self string, conn uint64) error {
	mv, ok := e.opts.GrantVerifier.(MoveVerifier)
	if !ok || self == "" {
		return fmt.Errorf("%w: drop cluster table %q: this storage node cannot ask etcd where its partition is placed", ErrNoVerifier, name)
	}
	e.mu.Lock()
	t, found := e.byName[name]
	var moving bool
	if found {
		moving = e.moveOf(t) != nil
	}
	e.mu.Unlock()
	switch {
	case !found:
		return fmt.Errorf("%w: %q", ErrTableNotFound, name)
	case !t.cluster.IsCluster():
		return fmt.Errorf("%w: %q is not a cluster table", ErrTableOwned, name)
	case moving:
		return fmt.Errorf("%w: cluster table %q is a move's copy: finish or roll back the move first", ErrTableOwned, name)
	}
	base, _ := clusterTableName(t.name, t.cluster.Partition)
	v, err := e.moveView(ctx, conn, mv, base, t.cluster.Partition)
	switch {
	case errors.Is(err, ErrFenced):
		// A name etcd cannot hold: never placed anywhere.
	case err != nil:
		return fmt.Errorf("drop cluster table %q: %w", name, err)
	case v.Node == self:
		return fmt.Errorf("%w: cluster table %q: etcd's partition map places it on this node", ErrTableOwned, name)
	case v.Moving && (v.From == self || v.To == self):
		return fmt.Errorf("%w: cluster table %q: a move of its partition from or to this node is recorded in etcd", ErrTableOwned, name)
	}
	return e.dropTable(name, 0, t)
}
