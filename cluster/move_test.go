package cluster

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// The switch keeps the owner key (ownership never changes hands at a switch), and MoveFloor
// is the target's grant floor: just below the kept grant's epoch while it lives; at least
// the switch's revision once it ended; just below a grant's epoch created after the switch;
// ErrMapChanged before the switch. On b47b8eb the switch deleted the owner key.
func TestMoveSwitchKeepsOwnerKey(t *testing.T) {
	ctx := testCtx(t)
	c := sharedClient(t)
	tm, err := c.CreateTable(ctx, "mv", Layout{Partitions: 2, StripePages: 1}, []string{"127.0.0.1:7001", "127.0.0.1:7002"})
	require.NoError(t, err)
	mover, err := c.NewSession(ctx, SessionConfig{Owner: 9})
	require.NoError(t, err)
	defer mover.Close(ctx)
	owner, err := c.NewSession(ctx, SessionConfig{Owner: 1, Addr: "game-1:7000"})
	require.NoError(t, err)
	defer owner.Close(ctx)
	o := acquire(t, ctx, owner, "mv", 0)

	rec, _, err := c.BeginMove(ctx, MoveRecord{Table: "mv", Part: 0, Created: tm.Created, Rev: tm.Revs[0],
		From: tm.Nodes[0], To: "127.0.0.1:7003", Lease: mover.Lease()})
	require.NoError(t, err)
	_, err = c.MoveFloor(ctx, rec)
	require.ErrorIs(t, err, ErrMapChanged, "not switched yet")
	// A stale owner epoch: the compare fails, nothing changes.
	_, err = c.SwitchMoved(ctx, rec, o.Epoch()+1)
	require.ErrorIs(t, err, ErrMapChanged)
	rev, err := c.SwitchMoved(ctx, rec, o.Epoch())
	require.NoError(t, err)

	h, held, err := c.Owner(ctx, "mv", 0)
	require.NoError(t, err)
	require.True(t, held, "the switch keeps the owner key")
	require.Equal(t, o.Epoch(), h.Epoch)
	require.NoError(t, o.Check(), "the owner's grant still vouches")
	floor, err := c.MoveFloor(ctx, rec)
	require.NoError(t, err)
	require.Equal(t, o.Epoch()-1, floor, "the kept grant is above the floor")
	other, err := c.NewSession(ctx, SessionConfig{Owner: 2})
	require.NoError(t, err)
	defer other.Close(ctx)
	_, err = other.Acquire(ctx, "mv", 0)
	require.ErrorIs(t, err, ErrOwned, "nobody else acquires the partition while the owner's session lives")

	// Released: the floor is at least the switch's revision (the ended grant fenced); for
	// a grant made after the switch, just below its epoch.
	require.NoError(t, o.Release(ctx))
	floor, err = c.MoveFloor(ctx, rec)
	require.NoError(t, err)
	require.GreaterOrEqual(t, floor, uint64(rev))
	o2 := acquire(t, ctx, other, "mv", 0)
	require.Greater(t, o2.Epoch(), uint64(rev))
	floor, err = c.MoveFloor(ctx, rec)
	require.NoError(t, err)
	require.Equal(t, o2.Epoch()-1, floor)
}

// MoveFloor fences every grant that ended before its read, those made after the switch
// too: a grant acquired after the switch (the target not live yet) and released, then
// another. Fails on 7f9ad60: the floor was the switch's revision, below the ended grant's
// epoch, so the target activated with it would take that ended grant's registration (were
// its verification in etcd to race the release).
func TestMoveFloorFencesGrantsEndedAfterSwitch(t *testing.T) {
	ctx := testCtx(t)
	c := sharedClient(t)
	rec, rev := switchedMove(t, ctx, c, "mvf")

	a, err := c.NewSession(ctx, SessionConfig{Owner: 1})
	require.NoError(t, err)
	defer a.Close(ctx)
	oa := acquire(t, ctx, a, "mvf", 0)
	require.Greater(t, oa.Epoch(), uint64(rev))
	require.NoError(t, oa.Release(ctx))
	floor, err := c.MoveFloor(ctx, rec)
	require.NoError(t, err)
	require.GreaterOrEqual(t, floor, oa.Epoch(), "the grant ended before the read is fenced")

	b, err := c.NewSession(ctx, SessionConfig{Owner: 2})
	require.NoError(t, err)
	defer b.Close(ctx)
	ob := acquire(t, ctx, b, "mvf", 0)
	floor, err = c.MoveFloor(ctx, rec)
	require.NoError(t, err)
	require.GreaterOrEqual(t, floor, oa.Epoch(), "the grant ended before the read is fenced")
	require.Less(t, floor, ob.Epoch(), "the live grant is taken")
}

// A switch with no owner key leaves none, and the floor is at least the switch's revision.
func TestMoveSwitchUnowned(t *testing.T) {
	ctx := testCtx(t)
	c := sharedClient(t)
	rec, rev := switchedMove(t, ctx, c, "mv")
	_, held, err := c.Owner(ctx, "mv", 0)
	require.NoError(t, err)
	require.False(t, held)
	floor, err := c.MoveFloor(ctx, rec)
	require.NoError(t, err)
	require.GreaterOrEqual(t, floor, uint64(rev))
}

// switchedMove creates table name (one partition, on 127.0.0.1:7001), begins the move of its
// partition to 127.0.0.1:7003 under a mover's session (owner 9, closed at the test's end)
// and switches it with no owner key; it returns the move's record and the switch's revision.
func switchedMove(t *testing.T, ctx context.Context, c *Client, name string) (MoveRecord, int64) {
	t.Helper()
	tm, err := c.CreateTable(ctx, name, Layout{Partitions: 1, StripePages: 1}, []string{"127.0.0.1:7001"})
	require.NoError(t, err)
	mover, err := c.NewSession(ctx, SessionConfig{Owner: 9})
	require.NoError(t, err)
	t.Cleanup(func() { mover.Close(ctx) })
	rec, _, err := c.BeginMove(ctx, MoveRecord{Table: name, Part: 0, Created: tm.Created, Rev: tm.Revs[0],
		From: tm.Nodes[0], To: "127.0.0.1:7003", Lease: mover.Lease()})
	require.NoError(t, err)
	rev, err := c.SwitchMoved(ctx, rec, 0)
	require.NoError(t, err)
	return rec, rev
}
