package txnode

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
)

// doneTwiceStore acknowledges commit batches at once, as ackStore does; armed, it calls one
// batch's done a second time, before its Commit returns, and reports what that call panicked
// with.
type doneTwiceStore struct {
	ackStore
	armed    atomic.Bool
	panicked chan any
}

func (s *doneTwiceStore) Commit(b *base.Batch, done func(uint64, error)) {
	s.ackStore.Commit(b, done)
	if s.armed.CompareAndSwap(true, false) {
		func() {
			defer func() { s.panicked <- recover() }()
			done(0, nil)
		}()
	}
}

// TestCommitBatchDoneTwicePanics: a store that calls a batch's done twice breaks the Store
// contract; the pipeline's assertion names it rather than retiring the batch again.
func TestCommitBatchDoneTwicePanics(t *testing.T) {
	ctx := context.Background()
	s := &doneTwiceStore{ackStore: ackStore{Store: newLocalStore(t, "")}, panicked: make(chan any, 1)}
	db, err := Open(ctx, Options{Store: s})
	require.NoError(t, err)
	t.Cleanup(func() { db.Close(ctx) })
	tb, err := db.CreateTable(ctx, "t", 64)
	require.NoError(t, err)
	s.armed.Store(true)
	_, err = tb.Insert(ctx, u64Row(64, 1))
	require.NoError(t, err)
	require.Equal(t, "weft: invariant violated: txnode: commit batch completed twice", recvWithin(t, s.panicked, "the second done"))
	_, err = tb.Insert(ctx, u64Row(64, 2)) // the pipeline goes on: the assertion changed nothing
	require.NoError(t, err)
}

// TestLaunchOutOfSeqOrderPanics: a batch numbered with a seq already launched (a seq reset
// other than a recovery's) is caught before it reaches the store.
func TestLaunchOutOfSeqOrderPanics(t *testing.T) {
	ctx := context.Background()
	db, err := Open(ctx, Options{Store: &ackStore{Store: newLocalStore(t, "")}})
	require.NoError(t, err)
	t.Cleanup(func() { db.Close(ctx) })
	tb, err := db.CreateTable(ctx, "t", 64)
	require.NoError(t, err)
	_, err = tb.Insert(ctx, u64Row(64, 1))
	require.NoError(t, err)

	p := db.pipe
	p.mu.Lock()
	launched := p.launchedSeq
	b := p.newBatchLocked()
	p.nextSeq = launched // as if the seq went back with no recovery
	got := func() (r any) {
		defer func() { r = recover() }()
		p.launchLocked(b)
		return nil
	}()
	nextSeq, inflight := p.nextSeq, len(p.inflight)
	p.mu.Unlock()
	require.NotZero(t, launched)
	require.Equal(t, fmt.Sprintf("weft: invariant violated: txnode: commit batch seq %d launched after seq %d", launched, launched), got)
	require.Equal(t, launched+1, nextSeq) // taken before the check: the order is intact again
	require.Zero(t, inflight)

	_, err = tb.Insert(ctx, u64Row(64, 2))
	require.NoError(t, err)
}
