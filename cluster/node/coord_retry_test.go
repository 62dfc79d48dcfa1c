package node_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/txnode"
)

// A two-phase commit whose prepare a storage node refuses with ErrTxnLocked (a row in doubt
// for another transaction) is run again by Update itself: the caller sees success.
func TestCoordRetryTxnLocked(t *testing.T) {
	ctx := testCtx(t)
	_, a, ta, x, y := startTwoAccounts(t, ctx)

	var refused atomic.Int32
	restore := node.SetPrepareAnswer(func(i int, err error) error {
		if err == nil && i == 1 && refused.Add(1) <= 3 {
			return txnode.ErrTxnLocked
		}
		return err
	})
	defer restore()
	require.NoError(t, xfer(ctx, a, ta, x, y, 10))
	require.Equal(t, int32(4), refused.Load(), "three refusals, then the commit")
	bal, _, err := sums(ctx, a, ta, []uint64{x, y})
	require.NoError(t, err)
	require.Equal(t, uint64(2*initial), bal)
}

// The retry is bounded: rows in doubt for good make Update return ErrTxnLocked once its
// attempts are spent, and nothing was written.
func TestCoordRetryTxnLockedBounded(t *testing.T) {
	ctx := testCtx(t)
	_, a, ta, x, y := startTwoAccounts(t, ctx)

	defer node.SetLockedRetries(3, time.Millisecond)()
	var refused atomic.Int32
	restore := node.SetPrepareAnswer(func(i int, err error) error {
		if err == nil && i == 1 {
			refused.Add(1)
			return txnode.ErrTxnLocked
		}
		return err
	})
	err := xfer(ctx, a, ta, x, y, 10)
	restore()
	require.ErrorIs(t, err, txnode.ErrTxnLocked)
	require.Equal(t, int32(4), refused.Load(), "the first attempt and three more")
	bal, recv, err := sums(ctx, a, ta, []uint64{x, y})
	require.NoError(t, err)
	require.Equal(t, uint64(2*initial), bal)
	require.Zero(t, recv, "no transfer committed")
}

// Two Updates contending on the same rows across partitions (storage nodes) both succeed,
// however their prepares interleave: conflicts and rows in doubt are retried inside Update.
func TestCoordRetryContendingUpdates(t *testing.T) {
	ctx := testCtx(t)
	_, a, ta, x, y := startTwoAccounts(t, ctx)

	const rounds = 50
	var wg sync.WaitGroup
	errs := make(chan error, 2*rounds)
	for _, dir := range [][2]uint64{{x, y}, {y, x}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				errs <- xfer(ctx, a, ta, dir[0], dir[1], 1)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	bal, recv, err := sums(ctx, a, ta, []uint64{x, y})
	require.NoError(t, err)
	require.Equal(t, uint64(2*initial), bal)
	require.Equal(t, uint64(2*rounds), recv)
}
