package storenode

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
)

// Each verified move step's rule against etcd's view (move_verify.go): a row per case, the
// view that of a move from "a" to "b" of mover epoch 10 at revision 20 unless changed.
func TestMoveStepRules(t *testing.T) {
	moving := MoveView{Moving: true, Epoch: 10, From: "a", To: "b", Node: "a", Revision: 20}
	switched := moving
	switched.Node = "b"
	none := MoveView{Node: "a", Revision: 20}
	for _, c := range []struct {
		name  string
		v     MoveView
		step  MoveStep
		epoch uint64
		floor uint64
		self  string
		ok    bool
	}{
		{"begin at the target", moving, MoveStepBegin, 10, 0, "b", true},
		{"begin at the source", moving, MoveStepBegin, 10, 0, "a", false},
		{"begin of another epoch", moving, MoveStepBegin, 9, 0, "b", false},
		{"begin, no move", none, MoveStepBegin, 10, 0, "b", false},
		{"begin after the switch", switched, MoveStepBegin, 10, 0, "b", false},
		{"freeze at the source", moving, MoveStepFreeze, 10, 0, "a", true},
		{"freeze at the target", moving, MoveStepFreeze, 10, 0, "b", false},
		{"freeze of a higher epoch", moving, MoveStepFreeze, 11, 0, "a", false},
		{"freeze under 2^64-1", moving, MoveStepFreeze, ^uint64(0), 0, "a", false},
		{"freeze, no move", none, MoveStepFreeze, 10, 0, "a", false},
		{"freeze after the switch", switched, MoveStepFreeze, 10, 0, "a", false},
		{"retire after the switch", switched, MoveStepRetire, 10, 0, "a", true},
		{"retire at the target", switched, MoveStepRetire, 10, 0, "b", false},
		{"retire of another epoch", switched, MoveStepRetire, 11, 0, "a", false},
		{"retire, no move", MoveView{Node: "b", Revision: 20}, MoveStepRetire, 10, 0, "a", false},
		{"retire before the switch", moving, MoveStepRetire, 10, 0, "a", false},
		{"retire under an epoch above the revision", switched, MoveStepRetire, 21, 0, "a", false},
		{"activate after the switch", switched, MoveStepActivate, 10, 19, "b", true},
		{"activate at the revision", switched, MoveStepActivate, 10, 20, "b", true},
		{"activate of another epoch", switched, MoveStepActivate, 11, 19, "b", false},
		{"activate at the source", MoveView{Moving: true, Epoch: 10, From: "b", To: "a", Node: "b", Revision: 20}, MoveStepActivate, 10, 19, "b", false},
		{"activate, no move", MoveView{Node: "b", Revision: 20}, MoveStepActivate, 10, 19, "b", false},
		{"activate before the switch", moving, MoveStepActivate, 10, 19, "b", false},
		{"activate under floor 2^64-1", switched, MoveStepActivate, 10, ^uint64(0), "b", false},
		{"activate under floor 0", switched, MoveStepActivate, 10, 0, "b", false},
		{"activate under epoch 2^64-1", switched, MoveStepActivate, ^uint64(0), 19, "b", false},
		{"thaw, no move", none, MoveStepThaw, 10, 0, "a", true},
		{"thaw, a move recorded", moving, MoveStepThaw, 10, 0, "a", false},
		{"thaw of a copy the map left", MoveView{Node: "b", Revision: 20}, MoveStepThaw, 10, 0, "a", false},
		{"thaw under 2^64-1", none, MoveStepThaw, ^uint64(0), 0, "a", false},
	} {
		err := checkMoveStep(c.v, c.step, c.epoch, c.floor, c.self)
		require.Equal(t, c.ok, err == nil, "%s: %v", c.name, err)
	}
}

// A node without etcd verifies nothing (as before the steps were verified); one whose
// verifier cannot read moves refuses every verified step; epoch 0 is malformed.
func TestMoveVerifyWithoutMoveVerifier(t *testing.T) {
	e := openTest(t, Options{})
	ti, err := e.CreateClusterTable(base.PartitionTableName("acct", 1), 64, moveLayout)
	require.NoError(t, err)
	require.NoError(t, e.VerifyMoveStep(context.Background(), ti.ID, MoveStepFreeze, ^uint64(0), 0, "a", 0))

	v := newMemVerifier()
	g := openTest(t, Options{GrantVerifier: v})
	ti, err = g.CreateClusterTable(base.PartitionTableName("acct", 1), 64, moveLayout)
	require.NoError(t, err)
	require.ErrorIs(t, g.VerifyMoveStep(context.Background(), ti.ID, MoveStepFreeze, 5, 0, "a", 0), ErrNoVerifier)
	require.ErrorIs(t, g.VerifyMoveStep(context.Background(), ti.ID, MoveStepFreeze, 0, 0, "a", 0), ErrMalformed)
}

// Retire and activate carry the mover's epoch: below the freeze's (the begin's) it is
// ErrFenced, a mover that lost the move or a stranger; at or above it, taken. An
// activation of a live copy raises its id high-water mark (an earlier activation of a lower
// one cannot make it grant the source's ids again).
func TestMoveRetireActivateEpochs(t *testing.T) {
	p := newMovePair(t)
	_, err := p.src.MoveFreeze(p.srcID, 5)
	require.NoError(t, err)
	require.ErrorIs(t, p.src.MoveRetire(p.srcID, 4), ErrFenced)
	require.ErrorIs(t, p.src.MoveRetire(p.srcID, 0), ErrMalformed)
	require.NoError(t, p.dst.MoveBegin(p.dstID, 5))
	require.ErrorIs(t, p.dst.MoveActivate(p.dstID, 4, 3, 0), ErrFenced)
	require.NoError(t, p.dst.MoveActivate(p.dstID, 6, 3, 0), "a mover that took the move over")
	_, next, err := p.dst.MoveStatus(p.dstID)
	require.NoError(t, err)
	require.NoError(t, p.dst.MoveActivate(p.dstID, 6, 3, next+1000), "activated again: the id mark raised")
	_, next2, err := p.dst.MoveStatus(p.dstID)
	require.NoError(t, err)
	require.Equal(t, next+1000, next2)
	require.NoError(t, p.src.MoveRetire(p.srcID, 6))
	st, _, err := p.src.MoveStatus(p.srcID)
	require.NoError(t, err)
	require.Equal(t, MoveRetired, st)
}
