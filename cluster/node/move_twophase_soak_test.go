package node_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/txnode"
)

// A partition moved back and forth under two-phase transfers, read-only Views of every
// account running beside them: every View sees the total (serializable across the switches),
// the transfers are refused only as not-owner or conflict (retried), and no money is made or
// lost. A move back to a storage node that held no partition meanwhile names it as primary
// again at once (before, its peers refused it for up to 500 ms: ErrUnknownPrimary), and a
// transfer that read an account before a switch and wrote it after runs again (before, it
// overwrote a transfer made on the target). Two moves in -short, four in CI, 16 with
// WEFT_SOAK=1.
func TestMoveBackAndForthUnderTwoPhaseLoad(t *testing.T) {
	ctx := testCtx(t)
	workers, accounts, moves := 6, 32, 4
	switch {
	case os.Getenv("WEFT_SOAK") == "1":
		moves = 16
	case testing.Short():
		workers, accounts, moves = 3, 8, 2
	}
	tc := startTxnCluster(t, 3, nil)
	a := tc.open(t, 0xa, "game-a:7000")
	ta := createTable(t, ctx, a, "acct", 64, 3, 1, tc.addrs)
	require.NoError(t, ta.Own(ctx, 0, 1))
	var in [2][]uint64
	for len(in[0]) < accounts/2 || len(in[1]) < accounts/2 {
		id, err := ta.Insert(ctx, acctRow(initial, 0))
		require.NoError(t, err)
		p := ta.Partition(id)
		in[p] = append(in[p], id)
	}
	all := append(append([]uint64(nil), in[0]...), in[1]...)
	defer a.Close(ctx)

	lctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	var committed atomic.Int64
	errs := make(chan error, workers+1)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			transfers(lctx, a, ta, in, uint64(w), 7, &committed, errs)
		}()
	}
	// A checker: every View sees the conserved total.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for lctx.Err() == nil {
			balance, _, err := sums(lctx, a, ta, all)
			var ne *node.NotOwnerError
			switch {
			case err == nil:
				if balance != uint64(len(all))*initial {
					errs <- fmt.Errorf("a View saw %d in all, not %d: money made or lost", balance, uint64(len(all))*initial)
					return
				}
			case lctx.Err() != nil:
				return
			case errors.As(err, &ne), errors.Is(err, txnode.ErrConflict):
			default:
				errs <- err
				return
			}
		}
	}()

	mover := tc.open(t, 0xb, "")
	mt := openTable(t, ctx, mover, "acct")
	for i := range moves {
		to := tc.addrs[2]
		if i%2 == 1 {
			to = tc.addrs[0]
		}
		require.NoError(t, mt.Move(ctx, 0, to), "move %d", i)
		base := committed.Load()
		for committed.Load() < base+int64(workers) && len(errs) == 0 && ctx.Err() == nil {
			require.NoError(t, xferRetry(ctx, a, ta, in[0][0], in[1][0]))
			committed.Add(1)
		}
		balance, _, err := sums(ctx, a, ta, all)
		if err == nil {
			require.Equal(t, uint64(len(all))*initial, balance, "after move %d", i)
		}
	}
	stop()
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	balance, received, err := sums(ctx, a, ta, all)
	require.NoError(t, err)
	if balance != uint64(len(all))*initial {
		dst := make([]byte, 64)
		for _, id := range all {
			err := a.View(ctx, func(tx *node.Tx) error { return tx.Get(ta, id, dst) })
			t.Logf("account %d (partition %d, %s): balance %d, received %d (%v)", id, ta.Partition(id), ta.NodeOf(id), balanceOf(dst), receivedOf(dst), err)
		}
		t.Logf("received in all %d, transfers acknowledged %d", received, committed.Load())
	}
	require.Equal(t, uint64(len(all))*initial, balance, "no money made or lost")
}
