package node_test

import (
	"context"
	"encoding/binary"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/storenode"
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
	tc, a, ta, x, y := startTwoAccounts(t, ctx)
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
	tc, a, ta, x, y := startTwoAccounts(t, ctx)
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
	returnsWithin(t, 30*time.Second, "Node.Close waited for the background abort record", func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		a.Close(cctx) // its error may be the gone primary's transaction node's
		cancel()
	})
}

// A two-phase commit aborted (a prepare refused) while the primary's transaction node died
// (its storage node fine): the Decide(abort) fails, and so does every background try over
// the dead transaction node. The primary's prepared part then stays in doubt while the
// coordinator's lease lives (its resolver asks the primary: no record, the lease alive), and
// a heal of the primary's transaction node registers the grant of that partition, which the
// storage node refuses while a transaction holds it in doubt (ErrTxnLocked, waited for): the
// heal never completes, and the node's owned partition there is unusable for as long as its
// session lives. The abort must be recorded over the successor before the heal's
// re-registration waits on it.
func TestCoordAbortRecordedWhenPrimaryDied(t *testing.T) {
	ctx := testCtx(t)
	tc := startTxnCluster(t, 2, func(o *storenode.Options) {
		o.TxnResolveAfter, o.TxnResolveInterval = 50*time.Millisecond, 50*time.Millisecond
	})
	a, ta, x, y := twoAccounts(t, ctx, tc)
	var err error
	primary := tc.srvAt(ta.NodeOf(x)) // x's storage node: written first, participant 0

	uctx, ucancel := context.WithCancel(ctx)
	defer ucancel()
	defer node.SetSerialPrepares(true)()
	var ids []base.TxnID
	defer node.SetTxnIDHook(func(id [16]byte) { ids = append(ids, id) })()
	fired := false
	defer node.SetCoordHook(func(step string, i int) {
		if step != "prepared" || i != 1 || fired {
			return
		}
		fired = true
		// x prepared at the primary; y changed under the transaction (its prepare refused:
		// the coordinator aborts); the primary's transaction node dies; the caller gives up
		// (the abort's Apply over the dead transaction node would be retried until then).
		require.NoError(t, a.Update(ctx, func(tx *node.Tx) error { return tx.Put(ta, y, acctRow(initial+1, 0)) }))
		require.NoError(t, node.DieDB(ctx, a, ta.NodeOf(x)))
		ucancel()
	})()
	err = transferOnce(uctx, a, ta, x, y)
	require.ErrorIs(t, err, errOneAttempt)
	require.True(t, fired)
	require.NoError(t, a.Session().Check(), "the coordinator's lease lives")

	// The background record's end (recorded, or given up): nothing else uses x's storage
	// node meanwhile.
	require.Eventually(t, func() bool { return node.Recording(a) == 0 }, 60*time.Second, 10*time.Millisecond)
	require.Len(t, ids, 1, "one two-phase commit")
	id := ids[0]
	d, err := primary.Engine().AskTxn(ctx, id, int64(a.Session().Lease()))
	require.NoError(t, err)
	require.Equal(t, base.DecisionAbort, d, "the abort is recorded at the primary (its prepared part is not left in doubt while the lease lives)")

	// x's partition is owned, its storage node up: a write goes through once the primary's
	// resolver applied the abort to x's part (the first try may find the dead transaction
	// node: the next one heals it).
	require.Eventually(t, func() bool {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return ta.Put(wctx, x, acctRow(initial+5, 0)) == nil
	}, 60*time.Second, 20*time.Millisecond, "the owned partition on the primary is usable again")
	row := make([]byte, 64)
	require.NoError(t, ta.Get(ctx, x, row))
	require.EqualValues(t, initial+5, balanceOf(row))

	// The node's background work ends: the abort's Apply of x's part over the dead
	// transaction node never succeeds (its storage node's resolver settled that part), so
	// the part is abandoned, not retried every 20 ms until Close.
	returnsWithin(t, 30*time.Second, "the node's background work did not end: an Apply over a closed transaction node is retried until Close",
		func() { node.WaitFinishing(a) })
}

// More aborts to record in the background than goroutines may record them at once
// (abortRecordMax, 64), their primary refusing every Decide for a while (ErrTxnBusy: its
// kept decisions at MaxTxns): each is recorded once the primary takes decisions again. On
// 9fe08b2 the 65th was dropped at once (a Warn record; "left to the resolvers"): its part,
// if prepared, stays in doubt for as long as the coordinator's lease lives. The primary
// records an abort only of a part it holds (issue 22, defect 5): each transaction's part is
// prepared at the primary first, by the node's owner under its lease, on a local table.
func TestCoordAbortRecordsPastTheGoroutines(t *testing.T) {
	ctx := testCtx(t)
	const n = 65
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	tc := startTxnCluster(t, 1, func(o *storenode.Options) {
		o.MaxTxns = n + 1
		o.TxnAbortKeep = time.Hour
		o.TxnResolveInterval = -1 // the test asks; no resolver of the parts
		o.Now = func() time.Time { return time.Unix(0, now.Load()) }
	})
	a := tc.open(t, 0xa, "game-a:7000")
	_, err := a.CreateTable(ctx, "acct", 64, 1, 1, tc.addrs) // dials the storage node
	require.NoError(t, err)
	eng := tc.srvs[0].Engine()
	// The primary's kept decisions at MaxTxns: aborts a resolver recorded (the lease gone),
	// participant count unknown, kept TxnAbortKeep.
	for k := range n + 1 {
		var id base.TxnID
		id[0] = 0xff
		binary.BigEndian.PutUint64(id[8:], uint64(k))
		d, err := eng.AskTxn(ctx, id, 1)
		require.NoError(t, err)
		require.Equal(t, base.DecisionAbort, d)
	}
	lease := int64(a.Session().Lease())
	local, err := eng.CreateTable("local", 64)
	require.NoError(t, err)
	g, err := eng.Acquire(local.ID, 0xa, 0)
	require.NoError(t, err)
	_, _, err = eng.AllocIDs(local.ID, 0xa, g.Epoch, 2)
	require.NoError(t, err)
	ids := make([]base.TxnID, n)
	for k := range ids {
		binary.BigEndian.PutUint64(ids[k][:8], uint64(lease))
		binary.BigEndian.PutUint64(ids[k][8:], uint64(k+1))
		page, slot := uint64(k)/64, uint(k)%64
		_, err := eng.PrepareTxn(&base.TxnPrepare{Txn: ids[k], Lease: lease, Batch: &base.Batch{Owner: 0xa,
			Seq: g.LastSeq + uint64(k) + 1, Fences: []base.Fence{{Table: local.ID, Epoch: g.Epoch}},
			Segments: []base.Segment{{Table: local.ID, Page: page, Data: 1 << slot, Rows: make([]byte, 64)}}}})
		require.NoError(t, err)
	}
	for k := range ids {
		node.RecordAbortLater(a, ids[k], lease, 1, tc.addrs[0])
	}
	_, err = eng.DecideTxn(ctx, ids[0], lease, base.DecisionAbort, 1)
	require.ErrorIs(t, err, storenode.ErrTxnBusy, "the primary takes no decision yet")
	// The kept aborts expire (the next decision sweeps them): the primary takes decisions.
	now.Add(int64(2 * time.Hour))
	require.Eventually(t, func() bool { return node.Recording(a) == 0 }, 60*time.Second, 10*time.Millisecond)
	for k, id := range ids {
		d, err := eng.AskTxn(ctx, id, lease)
		require.NoError(t, err)
		require.Equal(t, base.DecisionAbort, d, "abort %d of %d recorded", k+1, n)
		require.Equal(t, base.DecisionAbort, eng.TxnStatus(id).Primary, "abort %d of %d recorded", k+1, n)
	}
}

// Aborts being recorded in the background at a primary that is gone (its storage node shut
// down: every try fails, the transaction node dies and is replaced by a dial that fails):
// Node.Close ends every recording goroutine, none is left behind (goleak), and it returns.
func TestCoordAbortRecordNoLeakAtClose(t *testing.T) {
	ctx := testCtx(t)
	tc := startTxnCluster(t, 2, nil)
	warm := tc.open(t, 0xc, "")
	createTable(t, ctx, warm, "acct", 64, 2, 1, tc.addrs)
	opts := []goleak.Option{goleak.IgnoreCurrent(),
		goleak.IgnoreTopFunction("github.com/panjf2000/ants/v2.(*goWorker).run.func1")}
	cfg := node.Config{Etcd: cluster.Config{Endpoints: tc.etcd.Endpoints(), Prefix: prefix, Logger: quiet},
		Session: cluster.SessionConfig{Owner: 0xa, Addr: "game-a:7000"}, Logger: quiet, Secret: secret,
		CacheBytes: 1 << 20, RequestTimeout: 200 * time.Millisecond}
	a, err := node.Open(ctx, cfg)
	require.NoError(t, err)
	ta, err := a.OpenTable(ctx, "acct") // dials both storage nodes
	require.NoError(t, err)
	gone := ta.NodeOf(0)
	for i, addr := range tc.addrs {
		if addr == gone {
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			tc.srvs[i].Shutdown(sctx)
			cancel()
		}
	}
	lease := int64(a.Session().Lease())
	for k := range abortsAtClose {
		var id base.TxnID
		binary.BigEndian.PutUint64(id[:8], uint64(lease))
		binary.BigEndian.PutUint64(id[8:], uint64(k+1))
		node.RecordAbortLater(a, id, lease, 1, gone)
	}
	require.Positive(t, node.Recording(a))
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	a.Close(cctx) // its error may be the gone storage node's
	require.Zero(t, node.Recording(a))
	goleak.VerifyNone(t, opts...)
}

// abortsAtClose is more than the recording goroutines (64): some wait in the queue at Close.
const abortsAtClose = 80
