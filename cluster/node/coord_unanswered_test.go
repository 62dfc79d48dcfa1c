package node_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/txnode"
)

// Node.Close while a two-phase commit is between its recorded decision and its Applies: the
// Update returns (the parts abandoned to the storage nodes' resolvers), it does not retry
// Applies over closed transaction nodes until its context ends.
func TestCoordCloseDuringApplyReturns(t *testing.T) {
	ctx := testCtx(t)
	_, a, ta, x, y := startTwoAccounts(t, ctx)

	closed := make(chan error, 1)
	defer node.SetCoordHook(func(step string, _ int) {
		if step == "decided" {
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			closed <- a.Close(cctx)
			cancel()
		}
	})()
	done := make(chan error, 1)
	go func() { done <- xfer(ctx, a, ta, x, y, 10) }()
	require.NoError(t, <-closed)
	select {
	case err := <-done:
		require.NoError(t, err, "commit was recorded at the primary: committed")
	case <-time.After(20 * time.Second):
		t.Fatal("Update still retrying its Applies after Node.Close")
	}
}

// The Update's context ends with every part prepared, before the Decide's answer: Update
// returns ErrUnknownOutcome and the node goes on sending the SAME decision (commit) in the
// background, never another one: the transfer ends whole on both storage nodes (the rows stay
// locked in the cache until then: the reads below wait for it).
func TestCoordDecideUnansweredResendsCommit(t *testing.T) {
	ctx := testCtx(t)
	tc, a, ta, x, y := startTwoAccounts(t, ctx)
	var err error

	uctx, ucancel := context.WithCancel(ctx)
	defer ucancel()
	defer node.SetCoordHook(func(step string, _ int) {
		if step == "prepared-all" {
			ucancel()
		}
	})()
	err = xfer(uctx, a, ta, x, y, 10)
	require.ErrorIs(t, err, txnode.ErrUnknownOutcome)
	dst := make([]byte, 64)
	requireBalance(t, ctx, ta, x, dst, initial-10, "committed in the background")
	requireBalance(t, ctx, ta, y, dst, initial+10)
	// And durably so: another node, owning the partitions after a's Close, reads the same.
	require.NoError(t, a.Close(ctx))
	b := tc.open(t, 0xb, "game-b:7000")
	tb := openTable(t, ctx, b, "acct")
	require.NoError(t, tb.OwnWait(ctx, 0, 1))
	requireBalance(t, ctx, tb, x, dst, initial-10)
	requireBalance(t, ctx, tb, y, dst, initial+10)
}

// A prepare whose answer never comes (its storage node gone) while another part's prepare
// was answered: the coordinator aborts (it never decides commit), so the outcome is known:
// the Update fails with a definite error, not ErrUnknownOutcome (which tells the caller the
// transaction may have committed).
func TestCoordPrepareUnansweredIsDefiniteAbort(t *testing.T) {
	ctx := testCtx(t)
	tc, a, ta, x, y := startTwoAccounts(t, ctx)
	var err error
	defer shutDownWhenPrepared(tc.srvAt(ta.NodeOf(y)))() // y's storage node: prepared second (x is written first)
	uctx, ucancel := context.WithTimeout(ctx, 2*time.Second)
	defer ucancel()
	err = xfer(uctx, a, ta, x, y, 10)
	require.Error(t, err)
	require.NotErrorIs(t, err, txnode.ErrUnknownOutcome, "nothing was decided but abort: %v", err)
}
