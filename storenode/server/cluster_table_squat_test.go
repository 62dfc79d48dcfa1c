package server

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// mappedVerifier is an etcd whose partition map has every table, places every partition on
// the node *place names, and in which no grant is current and no move is recorded.
type mappedVerifier struct{ place atomic.Pointer[string] }

func (*mappedVerifier) VerifyGrant(context.Context, string, uint32, uint64, uint64) error {
	return storenode.ErrFenced
}
func (*mappedVerifier) Revision(context.Context) (uint64, error)          { return 1000, nil }
func (*mappedVerifier) TableMapped(context.Context, string) (bool, error) { return true, nil }
func (v *mappedVerifier) MovePlace(context.Context, string, uint32) (string, string, string, uint64, uint64, error) {
	return *v.place.Load(), "", "", 0, 1000, nil
}

// TestClusterTableSquatDroppable: a client created the cluster table of a partition of a
// mapped table ("acct" partition 1) on a storage node the map does not place it on, with a
// row size of its own choosing. Nobody ever holds it, but a cluster table's drop (by a
// client or an operator alike) was allowed only once etcd's map no longer has the table
// (verifyUnmapped asks whether "acct" is mapped, not whether its partition 1 is placed
// here): so nobody could drop it while "acct" lives, and every move of partition 1 to this
// node found a table of the name with another row size and rolled back (ErrMoveRefused,
// cluster/node's copyAndSwitch). One CreateClusterTable per partition and node blocked the
// cluster's moves to every node, for the table's life.
//
// What should happen: a client cannot create one the map does not place here (an operator,
// the mover creating a move's target, can); an operator drops a cluster table the map does
// not place on this node (a copy left behind), not one it places here. Fails on b3f6c9d: the
// client's creation is allowed, and the operator's drop is refused with ErrTableOwned.
func TestClusterTableSquatDroppable(t *testing.T) {
	v := &mappedVerifier{}
	elsewhere := "10.0.0.9:7070"
	v.place.Store(&elsewhere)
	env := startServer(t, func(cfg *Config) { cfg.Options.GrantVerifier = v })
	ctx := srvCtx(t)
	name := base.PartitionTableName("acct", 1)
	create := &sgio.CreateClusterTable{RowBytes: 8, Name: name, Layout: base.ClusterLayout{Partitions: 2, StripePages: 1, Partition: 1}}
	c := env.dial(testOwner + 100)
	require.ErrorIs(t, c.CallInto(ctx, create, &sgio.TableInfo{}), sgio.ErrForbidden,
		"a client's partition table on a node the map does not place it on")

	// Placed here: the client creates it, nobody but its holder drops it.
	here := env.addr
	v.place.Store(&here)
	require.NoError(t, c.CallInto(ctx, create, &sgio.TableInfo{}))
	op := env.dial(0, asOperator)
	require.ErrorIs(t, op.CallInto(ctx, &sgio.DropTable{Name: name}, &sgio.OK{}), storenode.ErrTableOwned,
		"the map places it here")

	// The map moved it elsewhere (the copy left behind): an operator drops it, a client not.
	v.place.Store(&elsewhere)
	require.ErrorIs(t, c.CallInto(ctx, &sgio.DropTable{Name: name}, &sgio.OK{}), storenode.ErrTableOwned)
	require.NoError(t, op.CallInto(ctx, &sgio.DropTable{Name: name}, &sgio.OK{}), "an operator drops a partition copy the map does not place here")
	_, err := env.srv.Engine().OpenTable(name)
	require.ErrorIs(t, err, storenode.ErrTableNotFound)

	// An operator (the mover creating a move's target) creates it where the map does not place it.
	require.NoError(t, op.CallInto(ctx, create, &sgio.TableInfo{}), "an operator's creation is not checked")
}
