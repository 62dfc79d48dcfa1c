package txnode

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A Session's pendings resolve in the order it issued them, a refused batch too: a write
// refused while the session's earlier write is still out resolves no earlier than that one
// (on e630a9e its Pending returned the range's ErrConflict at once, the earlier write still
// unanswered).
func TestSessionOrderAcrossRefusal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, fs := newAnswerRig(t)
	a, err := r.acct.Insert(ctx, row(1))
	require.NoError(t, err)
	gid, err := r.gold.Insert(ctx, row(1))
	require.NoError(t, err)

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
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, fs := newAnswerRig(t)
	gid, err := r.gold.Insert(ctx, row(1))
	require.NoError(t, err)
	g2, err := r.gold.Insert(ctx, row(1))
	require.NoError(t, err)

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
	err = pb.Wait(ended)
	require.ErrorIs(t, err, context.Canceled, "a later pending resolved before the session's earlier write")

	first.deliver()
	require.NoError(t, pa.Wait(ctx), "acknowledged before the failed batch")
	require.ErrorIs(t, pb.Wait(ctx), ErrUnknownOutcome)
	require.ErrorIs(t, s.Flush(ctx), ErrUnknownOutcome)
}
