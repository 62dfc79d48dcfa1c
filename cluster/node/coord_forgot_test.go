package node_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/internal/testclock"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/txnode"
)

// TestResentDecideAfterForgottenCommit: the answer to the coordinator's Decide(commit) is
// lost; before the resend every participant resolves (commit), applies and reports, so the
// primary forgets the commit, and the coordinator's lease is gone. The resend is answered
// commit from the primary's memory of forgotten decisions: Update returns nil (fails on
// e30d5f7: abort recorded, and Update reported ErrTxnDecided for a committed transfer).
// Past the memory's window ("late": the storage nodes' clock past TxnAbortKeep, the
// coordinator's past decideTrust) the primary records abort, and the coordinator reports
// ErrUnknownOutcome, never a definite abort. Either way the transfer is there, once.
func TestResentDecideAfterForgottenCommit(t *testing.T) {
	for _, late := range []bool{false, true} {
		name := map[bool]string{false: "forgotten", true: "late"}[late]
		t.Run(name, func(t *testing.T) {
			ctx := testCtx(t)
			clock := &testclock.Fake{}
			tc := startTxnCluster(t, 2, func(o *storenode.Options) {
				o.Now = clock.Now
				o.TxnResolveInterval = -1 // the test runs the passes
				o.TxnResolveAfter = time.Second
				o.TxnAbortKeep = time.Minute
			})
			a := tc.open(t, 0xa, "game-a:7000")
			ta := createTable(t, ctx, a, "acct", 64, 2, 1, tc.addrs)
			require.NoError(t, ta.Own(ctx, 0, 1))
			x := insertRow(t, ctx, ta, acctRow(initial, 0))
			y := insertRow(t, ctx, ta, acctRow(initial, 0))
			require.NotEqual(t, ta.NodeOf(x), ta.NodeOf(y))

			coordClock := &testclock.Fake{}
			defer node.SetCoordClock(coordClock.Now, time.Minute)()
			defer node.SetDecideAnswer(func(attempt int, err error) error {
				if attempt != 0 {
					return err
				}
				require.NoError(t, err, "the first Decide records commit")
				clock.Advance(2 * time.Second) // past TxnResolveAfter
				resolveAll(t, ctx, tc)
				for _, srv := range tc.srvs {
					_, decisions := srv.Engine().TxnCounts()
					require.Zero(t, decisions, "the primary forgot the commit")
				}
				require.NoError(t, a.Session().Close(ctx)) // the lease is gone
				if late {
					clock.Advance(2 * time.Minute)
					coordClock.Advance(2 * time.Minute)
				}
				return errors.New("the answer was lost")
			})()

			err := xfer(ctx, a, ta, x, y, 10)
			if late {
				require.ErrorIs(t, err, txnode.ErrUnknownOutcome)
				require.NotErrorIs(t, err, txnode.ErrTxnDecided)
			} else {
				require.NoError(t, err, "committed: the resend is answered commit")
				for _, srv := range tc.srvs {
					_, decisions := srv.Engine().TxnCounts()
					require.Zero(t, decisions, "no new record for the resend")
				}
			}

			b := tc.open(t, 0xb, "game-b:7000")
			tb := openTable(t, ctx, b, "acct")
			dst := make([]byte, 64)
			requireBalance(t, ctx, tb, x, dst, initial-10)
			requireBalance(t, ctx, tb, y, dst, initial+10)
		})
	}
}
