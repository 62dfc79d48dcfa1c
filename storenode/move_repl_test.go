package storenode

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/vfs"
)

// TestReplicatedMoveSteps: a partition move's steps under a Proposer, on the leader of three
// replicas: a target's begin (a follower refuses, a retry is answered, a lower epoch fenced),
// a source's mark and changes on the leader only, a freeze refused on the leader and at apply
// while a prepared transaction holds rows (the leader drains), an id grant proposed behind a
// freeze refused at apply, a freeze, a lower thaw fenced, a thaw (a rolled-back move) that
// writes again, a second freeze, a leader change (the new leader has no mark: ErrMoveLost), a
// retire; every replica's move states and rows agree, a reopened replica keeps them (its
// sidecar), and MoveActivate and MoveWrite are still ErrNotReplicated, changing nothing.
func TestReplicatedMoveSteps(t *testing.T) {
	v := newMemVerifier()
	g := newMemGroup(t, 3)
	clock := &fakeClock{}
	fss := make([]*vfs.FaultFS, len(g.engines))
	opts := func(i int) Options {
		o := replOptions(g, fss[i], i)
		o.GrantVerifier, o.TxnPeer, o.Now = v, &memPeers{}, clock.Now
		return o
	}
	for i := range g.engines {
		fss[i] = vfs.NewFaultFS()
		g.engines[i] = openEngine(t, opts(i))
	}
	defer func() {
		for _, e := range g.engines {
			e.Close()
		}
	}()
	g.changeLeader(0)
	ctx := context.Background()
	e, f := g.engines[0], g.engines[1]
	var src, dst base.TableInfo
	require.NoError(t, g.call(func() (err error) {
		src, err = e.CreateClusterTable(base.PartitionTableName("c", testLayout.Partition), 64, testLayout)
		return err
	}))
	require.NoError(t, g.call(func() (err error) {
		dst, err = e.CreateClusterTable(base.PartitionTableName("d", testLayout.Partition), 64, testLayout)
		return err
	}))
	rev := v.grant("c", testLayout.Partition, 7)
	var gr base.Grant
	require.NoError(t, g.call(func() (err error) { gr, err = e.RegisterGrant(ctx, src.ID, 7, rev); return err }))
	var first uint64
	require.NoError(t, g.call(func() (err error) { first, _, err = e.AllocIDs(src.ID, 7, gr.Epoch, 1); return err }))
	seq := uint64(0)
	put := func(id, val uint64) error {
		seq++
		err := g.call(func() error {
			_, err := e.CommitWait(&base.Batch{Owner: 7, Seq: seq, Fences: []base.Fence{{Table: src.ID, Epoch: gr.Epoch}},
				Segments: []base.Segment{oneRow(src.ID, id, row64(val))}})
			return err
		})
		if err != nil {
			seq--
		}
		return err
	}
	require.NoError(t, put(first, 1))
	states := func(id uint32, want MoveState, msg string) {
		t.Helper()
		g.drain()
		for i, x := range g.engines {
			s, _, err := x.MoveStatus(id)
			require.NoError(t, err)
			require.Equal(t, want, s, "%s: replica %d", msg, i)
		}
	}

	// The target: begin, proposed and applied everywhere.
	require.ErrorIs(t, f.MoveBegin(dst.ID, 5), ErrNotLeader)
	states(dst.ID, MoveLive, "a follower's begin")
	require.NoError(t, g.call(func() error { return e.MoveBegin(dst.ID, 5) }))
	states(dst.ID, MoveIncoming, "begun")
	require.NoError(t, g.call(func() error { return e.MoveBegin(dst.ID, 5) }), "a retry")
	require.ErrorIs(t, g.call(func() error { return e.MoveBegin(dst.ID, 4) }), ErrFenced)
	require.ErrorIs(t, g.call(func() error { return e.MoveBegin(src.ID, 5) }), ErrMoveState, "a granted table")
	_, err := f.MoveFreeze(src.ID, 5)
	require.ErrorIs(t, err, ErrNotLeader)

	// The source's mark is the leader's.
	_, err = f.MoveMark(src.ID)
	require.ErrorIs(t, err, ErrNotLeader)
	token, err := e.MoveMark(src.ID)
	require.NoError(t, err)
	require.NoError(t, put(first+1, 2))
	pages, _, err := e.MoveChanges(src.ID, token, 0, nil)
	require.NoError(t, err)
	require.Equal(t, []uint64{first / 64}, pages)

	// A prepared transaction holds rows: the freeze is refused on the leader, and at apply
	// when the prepare applies first; the leader drains the table.
	prep := func(txn byte, id uint64) func() error {
		seq++
		p := &base.TxnPrepare{Txn: txnID(txn), Lease: 99, Primary: "primary:1", Batch: &base.Batch{Owner: 7, Seq: seq,
			Fences: []base.Fence{{Table: src.ID, Epoch: gr.Epoch}}, Segments: []base.Segment{oneRow(src.ID, id, row64(9))}}}
		return func() error { _, err := e.PrepareTxn(p); return err }
	}
	prepared := asyncProposed(t, g, prep(1, first+2))
	frozen := asyncProposed(t, g, func() error { _, err := e.MoveFreeze(src.ID, 5); return err })
	g.drain()
	require.NoError(t, <-prepared)
	require.ErrorIs(t, <-frozen, ErrTxnLocked, "refused at apply")
	states(src.ID, MoveLive, "a freeze refused at apply")
	_, err = e.MoveFreeze(src.ID, 5)
	require.ErrorIs(t, err, ErrTxnLocked, "refused on the leader")
	require.ErrorIs(t, prep(2, first+3)(), ErrMoved, "the leader drains")
	seq--
	require.NoError(t, g.call(func() error { return e.ApplyTxn(txnID(1), base.DecisionAbort) }))

	// The freeze; an id grant proposed behind it is refused at apply.
	frozen = asyncProposed(t, g, func() error { _, err := e.MoveFreeze(src.ID, 5); return err })
	alloc := asyncProposed(t, g, func() error { _, _, err := e.AllocIDs(src.ID, 7, gr.Epoch, 1); return err })
	g.drain()
	require.NoError(t, <-frozen)
	require.ErrorIs(t, <-alloc, ErrMoved, "an id grant applied behind the freeze")
	states(src.ID, MoveFrozen, "frozen")
	var next [3]uint64
	for i, x := range g.engines {
		_, next[i], err = x.MoveStatus(src.ID)
		require.NoError(t, err)
	}
	require.Equal(t, next[0], next[1])
	require.Equal(t, next[0], next[2])
	require.ErrorIs(t, put(first+4, 3), ErrMoved)

	// A rolled-back move: a lower thaw is fenced, the thaw writes again.
	require.ErrorIs(t, g.call(func() error { return e.MoveThaw(src.ID, 4) }), ErrFenced)
	require.ErrorIs(t, f.MoveThaw(src.ID, 5), ErrNotLeader)
	require.NoError(t, g.call(func() error { return e.MoveThaw(src.ID, 5) }))
	states(src.ID, MoveLive, "thawed")
	var again uint64
	require.NoError(t, g.call(func() (err error) { again, _, err = e.AllocIDs(src.ID, 7, gr.Epoch, 1); return err }))
	require.Equal(t, next[0], again, "the id grant refused at apply left the leader's overlay")
	require.NoError(t, put(first+4, 4))

	// Again, under epoch 6; a leader change mid-move: the mark was the old leader's.
	token, err = e.MoveMark(src.ID)
	require.NoError(t, err)
	frozen = asyncProposed(t, g, func() error { _, err := e.MoveFreeze(src.ID, 6); return err })
	g.commit(math.MaxInt, func() bool { return true }) // the entry delivered twice: the second is answered
	for i := range g.engines {
		g.apply(i, math.MaxInt)
	}
	require.NoError(t, <-frozen)
	states(src.ID, MoveFrozen, "frozen again")
	g.changeLeader(1)
	e, f = g.engines[1], g.engines[0]
	_, _, err = e.MoveChanges(src.ID, token, 0, nil)
	require.ErrorIs(t, err, ErrMoveLost)
	require.ErrorIs(t, f.MoveRetire(src.ID, 6), ErrNotLeader)
	require.ErrorIs(t, g.call(func() error { return e.MoveRetire(src.ID, 5) }), ErrFenced)
	require.NoError(t, g.call(func() error { return e.MoveRetire(src.ID, 6) }))
	require.NoError(t, g.call(func() error { return e.MoveRetire(src.ID, 6) }), "a retry")
	states(src.ID, MoveRetired, "retired")
	require.ErrorIs(t, g.call(func() error { return e.MoveThaw(src.ID, 6) }), ErrMoveState)

	// Not replicated yet, and nothing changed by the refusal.
	require.ErrorIs(t, e.MoveActivate(dst.ID, 5, 1, 1<<20), ErrNotReplicated)
	_, err = e.MoveWrite([]base.Segment{oneRow(dst.ID, first, row64(1))}, 5)
	require.ErrorIs(t, err, ErrNotReplicated)
	states(dst.ID, MoveIncoming, "after the refused activation")

	// Every replica alike, rows and states; a reopened replica keeps them.
	g.drain()
	want := captureReplayState(t, g.engines[0])
	for i, x := range g.engines[1:] {
		requireSameLines(t, want, captureReplayState(t, x), fmt.Sprintf("replica %d", i+1))
	}
	for i := range g.engines {
		row, ok := readRow(t, g.engines[i], src.ID, first+4)
		require.True(t, ok, "replica %d", i)
		require.Equal(t, row64(4), row, "replica %d", i)
	}
	x := g.engines[2]
	require.NoError(t, x.Checkpoint())
	before := sidecarState(captureReplayState(t, x))
	require.NoError(t, x.Close())
	g.engines[2] = openEngine(t, opts(2))
	requireSameLines(t, before, sidecarState(captureReplayState(t, g.engines[2])), "a replica reopened from its checkpoint")
	for _, id := range []uint32{src.ID, dst.ID} {
		s, _, err := g.engines[2].MoveStatus(id)
		require.NoError(t, err)
		require.Equal(t, map[uint32]MoveState{src.ID: MoveRetired, dst.ID: MoveIncoming}[id], s)
	}
}

// asyncProposed runs fn on a goroutine and waits until it proposed (its entry in the group's
// tail, not committed), so two calls so run propose before either applies.
func asyncProposed(t *testing.T, g *memGroup, fn func() error) <-chan error {
	r := &replTxnGroup{t: t, g: g}
	return r.async(fn)
}

// FuzzDecodeMoveStepEntry: a move step's entry decodes without panicking, and what decodes
// encodes back to the same bytes.
func FuzzDecodeMoveStepEntry(f *testing.F) {
	f.Add(appendMoveStateRecord(nil, 3, MoveFrozen, 5))
	f.Add(appendMoveStateRecord(nil, 3, MoveLive, 0))
	f.Add(appendMoveStateRecord(nil, 3, MoveRetired, 6))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, p []byte) {
		id, s, epoch, err := decodeMoveStepEntry(p)
		if err != nil {
			return
		}
		require.Equal(t, p, appendMoveStateRecord(nil, id, s, epoch))
	})
}
