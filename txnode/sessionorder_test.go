package txnode

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
)

// A Session's pendings resolve in the order it issued them, a refused batch too: a write
// refused while the session's earlier write is still out resolves no earlier than that one
// (on e630a9e its Pending returned the range's ErrConflict at once, the earlier write still
// unanswered).
func TestSessionOrderAcrossRefusal(t *testing.T) {
	ctx, r, fs := newAnswerRig(t)
	a := insertRow(t, ctx, r.acct, row(1))
	gid := insertRow(t, ctx, r.gold, row(1))

	fs.armed.Store(true)
	s := r.db.Session()
	pa := s.Go(ctx, func(tx *Tx) error { return tx.Put(r.gold, gid, row(5)) })
	first := fs.next(t, ctx) // applied at the store, its answer held
	r.fenceAcct()
	pb := s.Go(ctx, func(tx *Tx) error { return tx.Put(r.acct, a, row(2)) })
	ro := s.Go(ctx, func(tx *Tx) error { return nil })
	refusal := fs.next(t, ctx)
	require.Less(t, first.seq, refusal.seq)
	refusal.deliver() // the recovery starts; the first write is still out

	ended, cancelEnded := context.WithCancel(ctx)
	cancelEnded()
	for _, p := range []*Pending{pb, ro} {
		err := p.Wait(ended)
		require.ErrorIs(t, err, context.Canceled, "a later pending resolved before the session's earlier write")
		require.ErrorIs(t, err, ErrUnknownOutcome)
	}
	select {
	case <-pb.Done():
		t.Fatal("a later pending resolved before the session's earlier write")
	default:
	}

	first.deliver()
	require.NoError(t, pa.Wait(ctx))
	require.ErrorIs(t, pb.Wait(ctx), ErrConflict)
	require.Error(t, ro.Wait(ctx))
	select {
	case <-pb.Done():
	case <-ctx.Done():
		t.Fatal("the refused pending never resolved")
	}
	// The recovery ends (acct latched); gold commits go on.
	fs.armed.Store(false)
	require.NoError(t, r.gold.Put(ctx, gid, row(7)))
	require.NoError(t, r.db.Close(ctx))
}

// The same when a later batch fails the pipeline for good (its answer, an unknown outcome,
// came first): the session's write in it resolves no earlier than its write before (on
// e630a9e it returned the pipeline's failure at once, the earlier write still out).
func TestSessionOrderAcrossFailure(t *testing.T) {
	ctx, r, fs := newAnswerRig(t)
	gid := insertRow(t, ctx, r.gold, row(1))
	g2 := insertRow(t, ctx, r.gold, row(1))

	fs.armed.Store(true)
	s := r.db.Session()
	pa := s.Go(ctx, func(tx *Tx) error { return tx.Put(r.gold, gid, row(5)) })
	first := fs.next(t, ctx)
	pb := s.Go(ctx, func(tx *Tx) error { return tx.Put(r.gold, g2, row(6)) })
	second := fs.next(t, ctx)
	require.Less(t, first.seq, second.seq)
	second.deliverErr(fmt.Errorf("%w: connection lost", ErrUnknownOutcome))

	ended, cancelEnded := context.WithCancel(ctx)
	cancelEnded()
	err := pb.Wait(ended)
	require.ErrorIs(t, err, context.Canceled, "a later pending resolved before the session's earlier write")

	first.deliver()
	require.NoError(t, pa.Wait(ctx), "acknowledged before the failed batch")
	require.ErrorIs(t, pb.Wait(ctx), ErrUnknownOutcome)
	require.ErrorIs(t, s.Flush(ctx), ErrUnknownOutcome)
}

// blockStore is an answerStore whose Commit blocks, once armed, until released: the sender
// is stuck in it, so later commits stay in the open batch.
type blockStore struct {
	*answerStore
	block   atomic.Bool
	blocked chan struct{}
	release chan struct{}
}

func (f *blockStore) Commit(b *base.Batch, done func(lsn uint64, err error)) {
	if f.block.CompareAndSwap(true, false) {
		f.blocked <- struct{}{}
		<-f.release
	}
	f.answerStore.Commit(b, done)
}

// A Session's read-only Pending after its held write, on a version of the open batch the
// refusal dropped (not held), resolves no earlier than that write (on e630a9e it returned
// the range's ErrConflict at once: waitOrdered waits only for a held version).
func TestSessionReadOfDroppedBatchAfterHeldWrite(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	as := &answerStore{holdStore: &holdStore{held: make(chan func(), 4)}, answers: make(chan heldAnswer, 16)}
	bs := &blockStore{answerStore: as, blocked: make(chan struct{}, 1), release: make(chan struct{})}
	r := newHoldRig(t, as.holdStore, bs)
	as.taken = func(heldAnswer) {}
	released := false
	var x, y heldAnswer
	defer func() { // a test failed midway leaves nothing for Close to wait for
		if !released {
			close(bs.release)
		}
		if x.done != nil {
			if y.done == nil {
				y = as.next(t, ctx)
			}
			x.deliver()
			y.deliver()
		}
		as.armed.Store(false)
	}()
	a := insertRow(t, ctx, r.acct, row(1))
	g1 := insertRow(t, ctx, r.gold, row(1))
	g2 := insertRow(t, ctx, r.gold, row(1))
	g3 := insertRow(t, ctx, r.gold, row(1))

	refusal, putErr := as.refuseWrite(t, ctx, r, func() error { return r.acct.Put(ctx, a, row(2)) })
	s := r.db.Session()
	pw := s.Go(ctx, func(tx *Tx) error { return tx.Put(r.gold, g1, row(5)) })
	x = as.next(t, ctx) // the session's write: held once the refusal is known
	bs.block.Store(true)
	yErr := make(chan error, 1)
	go func() { yErr <- r.gold.Put(ctx, g2, row(6)) }()
	<-bs.blocked // y is in flight, the sender stuck sending it
	zErr := make(chan error, 1)
	go func() { zErr <- r.gold.Put(ctx, g3, row(7)) }()
	// The session reads z's row once installed (z waits in the open batch).
	var ro *Pending
	for ro == nil {
		got := make([]byte, 64)
		p := s.Go(ctx, func(tx *Tx) error { return tx.Get(r.gold, g3, got) })
		if rowVal(got) == 7 {
			ro = p
		} else {
			select {
			case <-ctx.Done():
				t.Fatal("z never installed")
			default:
				runtime.Gosched()
			}
		}
	}
	refusal.deliver() // the recovery starts: x and y held, the open batch (z) dropped

	ended, cancelEnded := context.WithCancel(ctx)
	cancelEnded()
	require.ErrorIs(t, ro.Wait(ended), context.Canceled, "the read-only pending resolved before the session's held write")

	released = true
	close(bs.release)
	y = as.next(t, ctx)
	x.deliver()
	y.deliver()
	require.ErrorIs(t, pw.Wait(ctx), ErrConflict)
	require.ErrorIs(t, ro.Wait(ctx), ErrConflict)
	// y and z run again after the recovery (DB.Update): answered as they come.
	as.armed.Store(false)
	stopDrain := make(chan struct{})
	defer close(stopDrain)
	go func() {
		for {
			select {
			case a := <-as.answers:
				a.deliver()
			case <-stopDrain:
				return
			}
		}
	}()
	require.NoError(t, <-yErr)
	require.NoError(t, <-zErr)
	require.Error(t, <-putErr)
}
