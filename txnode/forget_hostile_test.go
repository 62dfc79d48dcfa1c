package txnode

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/txnode/store"
)

// Hostile review of forgetting a table (txncoord.Forget) (forget.go). Each test is named after the defect it shows
// and fails while the defect stands.

// forgetGateStore holds the first commit batch after it is armed inside Commit until gate is
// closed: the pipeline's goroutine that sends it (WriteBack: the flusher, which cuts the
// epochs) waits there, taking no other request meanwhile.
type forgetGateStore struct {
	store.Store
	armed   atomic.Bool
	entered chan struct{}
	gate    chan struct{}
}

func newForgetGateStore(s store.Store) *forgetGateStore {
	return &forgetGateStore{Store: s, entered: make(chan struct{}), gate: make(chan struct{})}
}

func (s *forgetGateStore) Commit(b *base.Batch, done func(uint64, error)) {
	if s.armed.CompareAndSwap(true, false) {
		close(s.entered)
		<-s.gate
	}
	s.Store.Commit(b, done)
}

// A DropTable that fails while a Forget of the same table flushes reopens the table to
// commits under the forget (closeTable(t, false): Forget's one-at-a-time semaphore covers
// other forgets only), so in WriteBack a commit admitted then is acknowledged, and the
// forget, whose flush was cut before it, drops its dirty frame unwritten: an acknowledged
// write lost. Should: the Put fail (ErrForgotten: the table is being forgotten) or, if
// acknowledged, be durable once the forget returns. Does: the Put is acknowledged and the
// re-opened table reads the row before it.
func TestForgetReopenedByFailedDropTableLosesAckedWrite(t *testing.T) {
	ctx := context.Background()
	const owner = 0x42
	g, st := grantStore(t, owner)
	gs := newForgetGateStore(st)
	db := openDB(t, ctx, Options{Store: gs, OwnerID: owner, grants: g, Durability: WriteBack, FlushInterval: time.Hour})
	defer db.Close(ctx)
	tb, err := db.createClusterTable(ctx, "acct", 64, base.ClusterLayout{Partitions: 1, StripePages: 1})
	require.NoError(t, err)
	name := base.PartitionTableName("acct", 0)
	x := insertRow(t, ctx, tb, row(1))
	require.NoError(t, db.Flush(ctx))
	require.NoError(t, tb.Put(ctx, x, row(2)))

	gs.armed.Store(true)
	forgot := make(chan error, 1)
	go func() { forgot <- tb.forget(ctx) }()
	recvWithin(t, gs.entered, "the forget's flush at the store")

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	require.Error(t, db.DropTable(cctx, name), "a DropTable whose flush cannot finish")
	perr := tb.Put(ctx, x, row(3))
	close(gs.gate)
	require.NoError(t, recvWithin(t, forgot, "the forget"))

	tb2 := openTable(t, ctx, db, name)
	dst := make([]byte, 64)
	require.NoError(t, tb2.Get(ctx, x, dst))
	if perr == nil {
		require.Equal(t, row(3), dst, "the Put acknowledged during the forget is lost")
	} else {
		require.ErrorIs(t, perr, ErrForgotten)
		require.Equal(t, row(2), dst)
	}
}

// A Pin in flight across a Forget of its table (its page fetch held at the store while the
// state is forgotten) fails with ErrTableNotFound ("was dropped": pinEndedLocked tells a
// forgotten state from a dropped one by nothing), not with ErrForgotten, which Forget's
// contract gives every call of the forgotten state's handles and which cluster/node counts
// as a lost grant (its Pin passes any other error to the game as is, the partition still
// listed as owned). Should: errors.Is(err, ErrForgotten). Does: ErrTableNotFound only.
func TestPinInFlightAcrossForgetNotErrForgotten(t *testing.T) {
	ctx := context.Background()
	const owner = 0x42
	g, st := grantStore(t, owner)
	hs := newHeldReadStore(st)
	db := openDB(t, ctx, Options{Store: hs, OwnerID: owner, grants: g})
	defer db.Close(ctx)
	tb, err := db.createClusterTable(ctx, "acct", 64, base.ClusterLayout{Partitions: 1, StripePages: 1})
	require.NoError(t, err)
	insertRow(t, ctx, tb, row(1))
	require.NoError(t, tb.forget(ctx))
	tb = openTable(t, ctx, db, base.PartitionTableName("acct", 0)) // its page not cached

	hs.armed.Store(true)
	pinned := make(chan error, 1)
	go func() { pinned <- tb.Pin(ctx) }()
	recvWithin(t, hs.entered, "the Pin's fetch at the store")
	require.NoError(t, tb.forget(ctx))
	close(hs.release)
	err = recvWithin(t, pinned, "the Pin")
	require.Error(t, err)
	require.ErrorIs(t, err, ErrForgotten, "the Pin of a forgotten state: %v", err)
}

// The other way round: a Forget that fails (its ctx ends during its flush) while a DropTable
// of the same table flushes reopens the table to commits under the drop, so a commit
// admitted then is acknowledged (WriteBack) although DropTable closed the table to commits
// ("they fail with ErrTableNotFound") and drops it with its unwritten frame.
// Should: the Put fail with ErrTableNotFound. Does: it is acknowledged.
func TestFailedForgetReopensTableBeingDropped(t *testing.T) {
	ctx := context.Background()
	const owner = 0x42
	g, st := grantStore(t, owner)
	gs := newForgetGateStore(st)
	db := openDB(t, ctx, Options{Store: gs, OwnerID: owner, grants: g, Durability: WriteBack, FlushInterval: time.Hour})
	defer db.Close(ctx)
	tb, err := db.createClusterTable(ctx, "acct", 64, base.ClusterLayout{Partitions: 1, StripePages: 1})
	require.NoError(t, err)
	name := base.PartitionTableName("acct", 0)
	x := insertRow(t, ctx, tb, row(1))
	require.NoError(t, db.Flush(ctx))
	require.NoError(t, tb.Put(ctx, x, row(2)))

	gs.armed.Store(true)
	dropped := make(chan error, 1)
	go func() { dropped <- db.DropTable(ctx, name) }()
	recvWithin(t, gs.entered, "the drop's flush at the store")
	// The flusher waits in the store: the forget's flush cannot even cut, and gives up
	// when its ctx ends.
	fctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	require.Error(t, tb.forget(fctx), "a Forget whose flush cannot finish")
	cancel()
	perr := tb.Put(ctx, x, row(3))
	close(gs.gate)
	require.NoError(t, recvWithin(t, dropped, "the drop"))
	require.ErrorIs(t, perr, ErrTableNotFound, "a write of a table being dropped")
}
