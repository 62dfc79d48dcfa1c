package node_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/txnode"
)

// A two-phase commit whose prepare a move's frozen source refuses (storenode's ErrMoved,
// over TCP) reaches the caller of Node.Update as the documented *NotOwnerError of the moving
// partition, matching txnode.ErrMoved (no import of storenode needed) and ErrAborted, never
// txnode.ErrUnknownOutcome: a definite abort. The game retries as documented: once the move
// is switched, the same Update commits, on the new copy.
func TestUpdateMovedSourceGivesNotOwner(t *testing.T) {
	ctx := testCtx(t)
	tc := startTxnCluster(t, 3, nil)
	a := tc.open(t, 0xa, "game-a:7000")
	// Partition 2 on the third storage node puts it in the map (its peers take it as a
	// primary at once), partitions 0 and 1 on the first two.
	ta := createTable(t, ctx, a, "acct", 64, 3, 1, tc.addrs)
	require.NoError(t, ta.Own(ctx, 0, 1))
	x, err := ta.Insert(ctx, acctRow(initial, 0))
	require.NoError(t, err)
	y, err := ta.Insert(ctx, acctRow(initial, 0))
	require.NoError(t, err)
	require.NotEqual(t, ta.NodeOf(x), ta.NodeOf(y))
	px := ta.Partition(x)
	require.NotEqual(t, tc.addrs[2], ta.NodeOf(x))
	require.NotEqual(t, tc.addrs[2], ta.NodeOf(y))

	_, mt := tc.openNodeTable(t, ctx, 0xb, "acct")
	release, moved := freezeHold(t, ctx, mt, px, tc.addrs[2])

	err = xfer(ctx, a, ta, x, y, 10)
	var ne *node.NotOwnerError
	require.True(t, errors.As(err, &ne), "a prepare refused by the frozen source is a *NotOwnerError, got %v", err)
	require.Equal(t, px, ne.Part)
	require.ErrorIs(t, err, node.ErrNotOwner)
	require.ErrorIs(t, err, txnode.ErrMoved)
	require.ErrorIs(t, err, node.ErrAborted)
	require.NotErrorIs(t, err, txnode.ErrUnknownOutcome)
	require.NotContains(t, err.Error(), "outcome unknown")

	close(release)
	require.NoError(t, <-moved)
	// Retried as documented (the Table follows the switch on its next operation).
	for try := 0; ; try++ {
		err = xfer(ctx, a, ta, x, y, 10)
		if err == nil || !errors.As(err, &ne) || try == 10 {
			break
		}
	}
	require.NoError(t, err)
	require.Equal(t, tc.addrs[2], ta.NodeOf(x))
	balance, _, err := sums(ctx, a, ta, []uint64{x, y})
	require.NoError(t, err)
	require.Equal(t, uint64(2*initial), balance)
	dst := make([]byte, 64)
	requireBalance(t, ctx, ta, x, dst, initial-10, "only the retried transfer committed")
}

// A two-phase commit whose second prepare's answer never comes (its storage node shut down)
// is aborted by its coordinator: the error says so in its words and its chain (ErrAborted),
// and neither reads nor matches "commit outcome unknown" (txnode.ErrUnknownOutcome).
func TestUpdatePrepareUnansweredSaysAborted(t *testing.T) {
	ctx := testCtx(t)
	tc, a, ta, x, y := startTwoAccounts(t, ctx)
	// y's storage node: prepared second (x is written first).
	defer shutDownWhenPrepared(tc.srvAt(ta.NodeOf(y)))()
	defer a.Close(ctx) // before the hooks are restored: the abort's record goes on in the background
	uctx, ucancel := context.WithTimeout(ctx, 2*time.Second)
	defer ucancel()
	err := xfer(uctx, a, ta, x, y, 10)
	require.Error(t, err)
	require.ErrorIs(t, err, node.ErrAborted)
	require.NotErrorIs(t, err, txnode.ErrUnknownOutcome)
	require.ErrorIs(t, err, context.DeadlineExceeded, "the cause is kept")
	require.Contains(t, err.Error(), "aborted")
	require.NotContains(t, err.Error(), "commit outcome unknown")
}
