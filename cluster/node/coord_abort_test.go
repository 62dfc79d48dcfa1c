package node_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/cluster/node"
)

// errOneAttempt is what transferOnce's transaction returns when run again.
var errOneAttempt = errors.New("stop")

// transferOnce moves 10 from account x to account y (rows of ta) in one attempt of a.Update:
// run again (a conflict, a failed commit), the transaction returns errOneAttempt instead.
func transferOnce(ctx context.Context, a *node.Node, ta *node.Table, x, y uint64) error {
	attempts := 0
	return a.Update(ctx, func(tx *node.Tx) error {
		if attempts++; attempts > 1 {
			return errOneAttempt
		}
		f, g, err := getPair(tx, ta, x, y)
		if err != nil {
			return err
		}
		if err := tx.Put(ta, x, acctRow(balanceOf(f)-10, 0)); err != nil {
			return err
		}
		return tx.Put(ta, y, acctRow(balanceOf(g)+10, 1))
	})
}

// A two-phase commit aborted (a prepare refused) after the coordinator's context ended: its
// Decide(abort) at the primary fails at once, so the node records it in the background, and
// a resolver's Ask (a part the coordinator could not reach) is answered abort at once, while
// the coordinator's lease still lives. On 258841e the abort was sent once, under the ended
// context: nothing was recorded, and the Ask answered "none" (wait for the lease to end). On
// 98d3383 the primary's part could be aborted in the background before the record was sent:
// the primary, holding no part, recorded nothing (a flake in CI's race step).
func TestCoordAbortRecordedAfterContextEnded(t *testing.T) {
	ctx := testCtx(t)
	tc := startTxnCluster(t, 2, nil)
	a, ta, x, y := twoAccounts(t, ctx, tc)
	var err error
	primary := tc.srvAt(ta.NodeOf(x)) // x's storage node: written first, participant 0

	uctx, ucancel := context.WithCancel(ctx)
	defer ucancel()
	defer node.SetSerialPrepares(true)()
	var ids []base.TxnID
	defer node.SetTxnIDHook(func(id [16]byte) { ids = append(ids, id) })()
	fired := false
	returned := make(chan struct{})  // the Update returned
	var primaryApplying atomic.Int32 // Applies sent to the primary's part (participant 0)
	var heldAtRecord *bool           // whether the primary held its part as the abort was recorded
	var applyingAtRecord int32
	defer node.SetCoordHook(func(step string, i int) {
		switch {
		case step == "applying" && i == 0:
			primaryApplying.Add(1)
			return
		case step == "abort-recording" && i == 0:
			// Held back until the Update returned (its part aborts done or handed on): the
			// primary's part must still be prepared, no Apply sent to it, else the primary
			// records nothing (it holds no part of the transaction).
			<-returned
			held := primary.Engine().TxnStatus(ids[0]).Prepared
			heldAtRecord, applyingAtRecord = &held, primaryApplying.Load()
			return
		}
		if step != "prepared" || i != 1 || fired {
			return
		}
		fired = true
		// x prepared at the primary. y changed under the transaction (its prepare is then
		// refused as a conflict: the coordinator aborts), and the caller's context ends.
		require.NoError(t, a.Update(ctx, func(tx *node.Tx) error { return tx.Put(ta, y, acctRow(initial+1, 0)) }))
		ucancel()
	})()
	err = transferOnce(uctx, a, ta, x, y) // a retry is errOneAttempt: no second two-phase commit
	close(returned)
	require.ErrorIs(t, err, errOneAttempt)
	require.True(t, fired)
	require.Error(t, uctx.Err(), "the coordinator's context ended before its abort")

	// The node's background work done (the abort recorded, then applied to x's part).
	node.WaitFinishing(a)
	require.NotNil(t, heldAtRecord, "the abort was recorded in the background")
	require.True(t, *heldAtRecord, "the primary's part is aborted only after the abort is recorded")
	require.Zero(t, applyingAtRecord, "no Apply is sent to the primary's part before its abort is recorded")
	require.Positive(t, primaryApplying.Load(), "the primary's part aborted after the record")
	require.NoError(t, a.Session().Check(), "the coordinator's lease lives")
	require.Len(t, ids, 1, "one two-phase commit")
	id := ids[0]
	d, err := primary.Engine().AskTxn(ctx, id, int64(a.Session().Lease()))
	require.NoError(t, err)
	require.Equal(t, base.DecisionAbort, d, "the primary holds the abort record: a resolver's Ask is answered at once")

	// The rows are as before the transfer, and usable.
	row := make([]byte, 64)
	require.NoError(t, ta.Get(ctx, x, row))
	require.EqualValues(t, initial, balanceOf(row))
	require.NoError(t, xfer(ctx, a, ta, x, y, 5))
}

// An abort whose primary is gone (shut down after its part was prepared): the node keeps
// trying to record it in the background, and Node.Close abandons that at once (it does not
// wait out the tries).
func TestCoordAbortRecordAbandonedAtClose(t *testing.T) {
	ctx := testCtx(t)
	tc := startTxnCluster(t, 2, nil)
	a, ta, x, y := twoAccounts(t, ctx, tc)
	var err error
	primary := tc.srvAt(ta.NodeOf(x))
	uctx, ucancel := context.WithCancel(ctx)
	defer ucancel()
	defer node.SetSerialPrepares(true)()
	fired := false
	defer node.SetCoordHook(func(step string, i int) {
		if step != "prepared" || i != 1 || fired {
			return
		}
		fired = true
		require.NoError(t, a.Update(ctx, func(tx *node.Tx) error { return tx.Put(ta, y, acctRow(initial+1, 0)) }))
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		primary.Shutdown(sctx)
		cancel()
		ucancel()
	})()
	err = transferOnce(uctx, a, ta, x, y)
	require.ErrorIs(t, err, errOneAttempt)
	require.True(t, fired)
	closed := make(chan struct{})
	go func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		a.Close(cctx) // its error may be the gone primary's transaction node's
		cancel()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Node.Close waited for the background abort record")
	}
}
