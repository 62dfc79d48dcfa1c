package storenode

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/vfs"
)

// replTxnGroup is three replicas of a memGroup with table "bank" (rows of 64 bytes) held by
// testOwner with one page of ids, for the replicated two-phase commit tests.
type replTxnGroup struct {
	t     *testing.T
	g     *memGroup
	peers *memPeers  // the replicas' TxnPeer
	clock *fakeClock // the replicas' clock
	fss   []*vfs.FaultFS
	table uint32
	epoch uint64
	seq   uint64
}

func replOptions(g *memGroup, fs vfs.FS, i int) Options {
	return Options{Dir: "db", FS: fs, Logger: quietLogger, CheckpointInterval: -1, TxnResolveInterval: -1,
		OwnerExpiry: time.Hour, Proposer: &memProposer{g: g, self: i}}
}

func newReplTxnGroup(t *testing.T) *replTxnGroup {
	r := &replTxnGroup{t: t, g: newMemGroup(t, 3), peers: &memPeers{}, clock: &fakeClock{}}
	for i := range r.g.engines {
		fs := vfs.NewFaultFS()
		r.fss = append(r.fss, fs)
		opts := replOptions(r.g, fs, i)
		opts.TxnPeer, opts.Now = r.peers, r.clock.Now
		r.g.engines[i] = openEngine(t, opts)
		e := r.g.engines[i]
		t.Cleanup(func() { e.Close() })
	}
	r.g.changeLeader(0)
	e := r.g.engines[0]
	var info base.TableInfo
	require.NoError(t, r.g.call(func() (err error) { info, err = e.CreateTable("bank", 64); return err }))
	var gr base.Grant
	require.NoError(t, r.g.call(func() (err error) { gr, err = e.Acquire(info.ID, testOwner, 0); return err }))
	require.NoError(t, r.g.call(func() error { _, _, err := e.AllocIDs(info.ID, testOwner, gr.Epoch, 1); return err }))
	r.table, r.epoch = info.ID, gr.Epoch
	r.g.drain()
	return r
}

func (r *replTxnGroup) leader() *Engine {
	r.g.mu.Lock()
	defer r.g.mu.Unlock()
	return r.g.engines[r.g.leader]
}

// prep is a prepare of testOwner's next seq writing row to v.
func (r *replTxnGroup) prep(id base.TxnID, primary string, index uint16, row, v uint64) *base.TxnPrepare {
	r.seq++
	return &base.TxnPrepare{Txn: id, Lease: 99, Primary: primary, Index: index, Batch: &base.Batch{Owner: testOwner, Seq: r.seq,
		Fences: []base.Fence{{Table: r.table, Epoch: r.epoch}}, Segments: []base.Segment{oneRow(r.table, row, row64(v))}}}
}

// prepare proposes p on e, committing and applying everything proposed until it returns.
func (r *replTxnGroup) prepare(e *Engine, p *base.TxnPrepare) (uint64, error) {
	var lsn uint64
	err := r.g.call(func() (err error) { lsn, err = e.PrepareTxn(p); return err })
	return lsn, err
}

func (r *replTxnGroup) decide(e *Engine, id base.TxnID, d base.Decision, count int) (base.Decision, error) {
	var got base.Decision
	err := r.g.call(func() (err error) { got, err = e.DecideTxn(context.Background(), id, 99, d, count); return err })
	return got, err
}

// async runs fn on a goroutine once the group's proposal signal is drained, and waits until
// fn proposed (its entry is in the tail, not committed): two calls so run propose before
// either applies.
func (r *replTxnGroup) async(fn func() error) <-chan error {
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case <-r.g.proposed:
	case err := <-done:
		r.t.Fatalf("returned before it proposed: %v", err)
	case <-time.After(10 * time.Second): // a bound, not a synchronisation
		r.t.Fatal("nothing proposed")
	}
	return done
}

// requireAgree requires every replica to hold the same state (all entries applied).
func (r *replTxnGroup) requireAgree(msg string) []string {
	r.g.drain()
	want := captureReplayState(r.t, r.g.engines[0])
	for i, e := range r.g.engines[1:] {
		requireSameLines(r.t, want, captureReplayState(r.t, e), fmt.Sprintf("%s: replica %d", msg, i+1))
	}
	return want
}

// TestReplicatedPrepareDecide: prepares, decisions, applies and reports proposed on the
// leader are applied on every replica alike: a retry is answered from the dedup window, an
// entry delivered twice is applied once, a prepare of locked rows proposed before the lock
// applied is refused at apply (everywhere), of two decisions (or applies) proposed for one
// transaction the first applied is kept and the second's caller told so, a commit every
// participant reported is forgotten everywhere; followers refuse with ErrNotLeader; a new
// leader prepares on; a replica rebuilt from the log and one reopened from its checkpoint
// (txnstate) agree.
func TestReplicatedPrepareDecide(t *testing.T) {
	r := newReplTxnGroup(t)
	e := r.leader()
	a := r.prep(txnID(1), "", 0, 1, 10)
	lsn, err := r.prepare(e, a)
	require.NoError(t, err)
	for i, x := range r.g.engines {
		require.True(t, x.TxnStatus(txnID(1)).Prepared, "replica %d", i)
	}
	again, err := r.prepare(e, a) // a retry: the dedup window answers
	require.NoError(t, err)
	require.Equal(t, lsn, again)
	_, err = e.CommitWait(&base.Batch{Owner: testOwner, Seq: r.seq + 1, Fences: []base.Fence{{Table: r.table, Epoch: r.epoch}},
		Segments: []base.Segment{oneRow(r.table, 1, row64(5))}})
	require.ErrorIs(t, err, ErrTxnLocked)

	// An entry delivered twice: the second copy is answered from the window.
	b := r.prep(txnID(2), "primary:1", 1, 2, 20)
	done := r.async(func() error { _, err := e.PrepareTxn(b); return err })
	r.g.commit(math.MaxInt, func() bool { return true })
	for i := range r.g.engines {
		r.g.apply(i, math.MaxInt)
	}
	require.NoError(t, <-done)

	// Two prepares of one row, both proposed before either applied: the second is refused
	// at apply, on every replica.
	c, d := r.prep(txnID(3), "primary:1", 0, 3, 30), r.prep(txnID(4), "primary:1", 0, 3, 40)
	doneC := r.async(func() error { _, err := e.PrepareTxn(c); return err })
	doneD := r.async(func() error { _, err := e.PrepareTxn(d); return err })
	r.g.drain()
	require.NoError(t, <-doneC)
	require.ErrorIs(t, <-doneD, ErrTxnLocked)
	r.seq-- // d's seq was refused: the next prepare takes it
	for i, x := range r.g.engines {
		require.True(t, x.TxnStatus(txnID(3)).Prepared, "replica %d", i)
		require.False(t, x.TxnStatus(txnID(4)).Prepared, "replica %d", i)
	}

	// Decisions: the compare-and-set at apply.
	got, err := r.decide(e, txnID(1), base.DecisionCommit, 2)
	require.NoError(t, err)
	require.Equal(t, base.DecisionCommit, got)
	got, err = r.decide(e, txnID(1), base.DecisionAbort, 2)
	require.ErrorIs(t, err, ErrTxnDecided)
	require.Equal(t, base.DecisionCommit, got)
	_, err = r.prepare(e, r.prep(txnID(5), "", 0, 5, 50))
	require.NoError(t, err)
	commitDone := r.async(func() error {
		_, err := e.DecideTxn(context.Background(), txnID(5), 99, base.DecisionCommit, 1)
		return err
	})
	abortDone := r.async(func() error {
		_, err := e.DecideTxn(context.Background(), txnID(5), 99, base.DecisionAbort, 1)
		return err
	})
	r.g.drain()
	require.NoError(t, <-commitDone)
	require.ErrorIs(t, <-abortDone, ErrTxnDecided)
	for i, x := range r.g.engines {
		require.Equal(t, base.DecisionCommit, x.TxnStatus(txnID(1)).Primary, "replica %d", i)
		require.Equal(t, base.DecisionCommit, x.TxnStatus(txnID(5)).Primary, "replica %d", i)
	}

	// Followers refuse; applying a decision is not replicated yet.
	f := r.g.engines[1]
	_, err = f.PrepareTxn(r.prep(txnID(6), "", 0, 6, 60))
	require.ErrorIs(t, err, ErrNotLeader)
	r.seq--
	_, err = f.DecideTxn(context.Background(), txnID(1), 99, base.DecisionCommit, 2)
	require.ErrorIs(t, err, ErrNotLeader)
	require.ErrorIs(t, f.ApplyTxn(txnID(3), base.DecisionAbort), ErrNotLeader)
	require.ErrorIs(t, f.ReportTxn(txnID(1), 0), ErrNotLeader)

	// Applies and reports: the primary's own part commits, a part aborts (again: answered,
	// the other decision: refused); two applies of one part proposed at once, the first
	// applied wins; the primary's commit is forgotten once both participants reported.
	apply := func(id base.TxnID, d base.Decision) error {
		return r.g.call(func() error { return e.ApplyTxn(id, d) })
	}
	require.NoError(t, apply(txnID(1), base.DecisionCommit))
	require.NoError(t, apply(txnID(3), base.DecisionAbort))
	require.NoError(t, apply(txnID(3), base.DecisionAbort))
	require.ErrorIs(t, apply(txnID(3), base.DecisionCommit), ErrTxnDecided)
	commitApply := r.async(func() error { return e.ApplyTxn(txnID(2), base.DecisionCommit) })
	abortApply := r.async(func() error { return e.ApplyTxn(txnID(2), base.DecisionAbort) })
	r.g.drain()
	require.NoError(t, <-commitApply)
	require.ErrorIs(t, <-abortApply, ErrTxnDecided)
	require.NoError(t, r.g.call(func() error { return e.ReportTxn(txnID(1), 0) }))
	require.NoError(t, r.g.call(func() error { return e.ReportTxn(txnID(1), 1) }))
	r.g.drain()
	for i, x := range r.g.engines {
		for row, want := range map[uint64]uint64{1: 10, 2: 20} {
			got, ok := readRow(t, x, r.table, row)
			require.True(t, ok, "replica %d row %d", i, row)
			require.Equal(t, want, uint64FromRow(got), "replica %d row %d", i, row)
		}
		_, ok := readRow(t, x, r.table, 3)
		require.False(t, ok, "replica %d: the aborted part's row", i)
		require.Equal(t, base.DecisionCommit, x.TxnStatus(txnID(1)).Applied, "replica %d", i)
		require.Equal(t, base.DecisionNone, x.TxnStatus(txnID(1)).Primary, "replica %d: the reported commit is kept", i)
		require.Equal(t, base.DecisionAbort, x.TxnStatus(txnID(3)).Applied, "replica %d", i)
	}
	state := r.requireAgree("after the first leader")

	// A new leader goes on from the applied state.
	r.g.changeLeader(1)
	_, err = r.prepare(f, r.prep(txnID(7), "primary:2", 2, 7, 70))
	require.NoError(t, err)
	_, err = r.decide(f, txnID(3), base.DecisionAbort, 0) // not prepared here as primary: no record
	require.NoError(t, err)
	state = r.requireAgree("after a leader change")
	require.NotEqual(t, len(state), 0)

	// A replica rebuilt from the whole log agrees.
	fresh := openEngine(t, replOptions(r.g, vfs.NewFaultFS(), 3))
	defer fresh.Close()
	for index := uint64(1); ; index++ {
		ent, ok := r.g.entry(index)
		if !ok {
			break
		}
		require.NoError(t, fresh.ApplyCommitted(index, 0, ent.kind, ent.payload), "entry %d", index)
	}
	requireSameLines(t, state, captureReplayState(t, fresh), "a replica rebuilt from the log")

	// A replica reopened from its checkpoint (its sidecar) agrees, and applies on.
	x := r.g.engines[2]
	require.NoError(t, x.Checkpoint())
	before := sidecarState(captureReplayState(t, x)) // after it: the page maps are in the meta
	require.NoError(t, x.Close())
	x = openEngine(t, replOptions(r.g, r.fss[2], 2))
	defer x.Close()
	r.g.engines[2] = x
	requireSameLines(t, before, sidecarState(captureReplayState(t, x)), "a replica reopened from its checkpoint")
	_, err = r.prepare(f, r.prep(txnID(8), "", 0, 8, 80))
	require.NoError(t, err)
	r.g.drain()
	for _, x := range r.g.engines {
		require.NoError(t, x.Checkpoint()) // every page map in its meta, as the reopened one's
	}
	want := sidecarState(captureReplayState(t, r.g.engines[0]))
	for i, x := range r.g.engines[1:] {
		requireSameLines(t, want, sidecarState(captureReplayState(t, x)), fmt.Sprintf("after the reopened replica applied on: replica %d", i+1))
	}
}

// TestReplicatedResolver: the leader's resolver settles a replicated participant's part
// against a standalone primary: it asks the decision, applies it (proposed), reports it and
// proposes the forgot record; every replica ends with the rows applied and the part
// forgotten. A follower's resolver does nothing.
func TestReplicatedResolver(t *testing.T) {
	r := newReplTxnGroup(t)
	e := r.leader()
	ps := newTxnStore(t, Options{})
	r.peers.set("primary", ps.e)
	id := txnID(40)
	ps.requirePrepared(t, id, 99, "", 0, 1, 1)
	_, err := r.prepare(e, r.prep(id, "primary", 1, 4, 44))
	require.NoError(t, err)
	got, err := ps.e.DecideTxn(context.Background(), id, 99, base.DecisionCommit, 2)
	require.NoError(t, err)
	require.Equal(t, base.DecisionCommit, got)

	r.clock.Advance(DefaultTxnResolveAfter) // the coordinator is late: the resolver asks
	f := r.g.engines[1]
	require.NoError(t, f.ResolveTxns(context.Background()))
	r.g.mu.Lock()
	require.Empty(t, r.g.tail, "a follower's resolver proposed")
	r.g.mu.Unlock()
	require.NoError(t, r.g.call(func() error { return e.ResolveTxns(context.Background()) }))
	r.g.drain() // the forgot record: nobody waits for it
	for i, x := range r.g.engines {
		require.Equal(t, TxnStatus{}, x.TxnStatus(id), "replica %d kept the part", i)
		row, ok := readRow(t, x, r.table, 4)
		require.True(t, ok, "replica %d", i)
		require.EqualValues(t, 44, uint64FromRow(row), "replica %d", i)
	}
	r.requireAgree("after the resolver")
}

// TestReplicatedDecisionExpiry: an abort kept as primary is forgotten on every replica by the
// leader's decision expiry entry once older than TxnAbortKeep on the leader's clock, never by
// a follower on its own; the leader answers a resent Decide from its forgotten decisions.
func TestReplicatedDecisionExpiry(t *testing.T) {
	r := newReplTxnGroup(t)
	e := r.leader()
	ctx := context.Background()
	id := txnID(50)
	_, err := r.prepare(e, r.prep(id, "", 0, 9, 90))
	require.NoError(t, err)
	got, err := r.decide(e, id, base.DecisionAbort, 2) // participant 1 never reports
	require.NoError(t, err)
	require.Equal(t, base.DecisionAbort, got)
	require.NoError(t, r.g.call(func() error { return e.ResolveTxns(ctx) }))
	r.g.mu.Lock()
	require.Empty(t, r.g.tail, "a young abort's expiry was proposed")
	r.g.mu.Unlock()

	r.clock.Advance(DefaultTxnAbortKeep)
	for i, x := range r.g.engines[1:] {
		require.NoError(t, x.ResolveTxns(ctx))
		require.Equal(t, base.DecisionAbort, x.TxnStatus(id).Primary, "follower %d forgot on its own clock", i+1)
	}
	require.NoError(t, r.g.call(func() error { return e.ResolveTxns(ctx) }))
	r.g.drain()
	expiries := 0
	for index := uint64(1); ; index++ {
		ent, ok := r.g.entry(index)
		if !ok {
			break
		}
		if ent.kind == kindTxnExpired {
			expiries++
		}
	}
	require.Equal(t, 1, expiries, "decision expiry entries")
	for i, x := range r.g.engines {
		require.Equal(t, TxnStatus{}, x.TxnStatus(id), "replica %d", i)
	}
	got, err = r.decide(e, id, base.DecisionAbort, 2)
	require.NoError(t, err, "a resent Decide")
	require.Equal(t, base.DecisionAbort, got)
	r.requireAgree("after the expiry")
}

// TestReplicatedAbortLearnsCount: an abort recorded without a participant count learns it from
// a later Decide by an entry, on every replica; its participants' reports then let the
// leader's next pass forget it everywhere, before TxnAbortKeep.
func TestReplicatedAbortLearnsCount(t *testing.T) {
	r := newReplTxnGroup(t)
	e := r.leader()
	id := txnID(60)
	_, err := r.prepare(e, r.prep(id, "", 0, 11, 110))
	require.NoError(t, err)
	_, err = r.decide(e, id, base.DecisionAbort, 0) // count unknown
	require.NoError(t, err)
	_, err = r.decide(e, id, base.DecisionAbort, 2) // answered from the kept abort, the count learned
	require.NoError(t, err)
	r.g.drain()
	for i, x := range r.g.engines {
		x.mu.Lock()
		require.EqualValues(t, 2, x.txnDecisions[id].count, "replica %d", i)
		x.mu.Unlock()
	}
	for index := range uint16(2) {
		require.NoError(t, r.g.call(func() error { return e.ReportTxn(id, index) }))
	}
	require.NoError(t, r.g.call(func() error { return e.ResolveTxns(context.Background()) }))
	r.g.drain()
	for i, x := range r.g.engines {
		require.Equal(t, base.DecisionNone, x.TxnStatus(id).Primary, "replica %d kept the reported abort", i)
	}
	r.requireAgree("after the reports")
}
