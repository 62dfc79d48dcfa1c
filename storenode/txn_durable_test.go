package storenode

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/testkit"
	"github.com/weftdb/weft/internal/vfs"
)

// errReportLost is the WAL write error TestTxnDuplicateReportWaitsDurable injects.
var errReportLost = errors.New("test: the report record's write is lost")

// TestTxnDuplicateReportWaitsDurable: a report repeated while the first one's record is not
// durable yet (a resolver's retry after its call timed out, the first still in the primary's
// WAL queue) is acknowledged only once that record is: else the participant forgets its part
// on the second answer, the record is lost (a crash, or here a failed write), and the primary
// keeps the decision for ever with nobody left to report it (a commit is never swept: at
// MaxTxns of them every Decide fails with ErrTxnBusy). Both shapes: the report that is still
// to come (count 2), and the last one, after which the commit is forgotten in memory at once
// (count 1).
func TestTxnDuplicateReportWaitsDurable(t *testing.T) {
	for _, count := range []int{2, 1} {
		fs := vfs.NewFaultFS()
		e, err := Open(Options{Dir: "db", FS: fs, CheckpointInterval: -1, CheckpointWALBytes: -1,
			TxnResolveInterval: -1, Logger: quietLogger})
		require.NoError(t, err)
		id := txnID(1)
		setupTxnStore(t, e).primaryPart(t, id, 5)
		_, err = e.DecideTxn(context.Background(), id, 5, base.DecisionCommit, count)
		require.NoError(t, err)

		var (
			mu      sync.Mutex
			hold    = true
			walHeld = make(chan struct{})
			walGo   = make(chan struct{})
		)
		fs.Inject(func(op vfs.Op) error {
			mu.Lock()
			h := hold
			if h && op.Kind == vfs.OpWrite && strings.HasPrefix(op.Name, "db/wal/") {
				hold = false
				mu.Unlock()
				close(walHeld)
				<-walGo
				return errReportLost
			}
			mu.Unlock()
			return nil
		})
		first := make(chan error, 1)
		go func() { first <- e.ReportTxn(id, 0) }()
		<-walHeld // the first report's record is queued, its write held
		second := make(chan error, 1)
		go func() { second <- e.ReportTxn(id, 0) }()
		deadline := time.Now().Add(30 * time.Second)
		var early error
		returned := false
		for !returned && testkit.GoroutinesIn("storenode.(*Engine).waitDurable") < 2 {
			select {
			case early = <-second:
				returned = true
			case <-time.After(time.Millisecond): // polling a goroutine dump: nothing reports the park
			}
			require.True(t, time.Now().Before(deadline), "count %d: the second report neither returned nor waited", count)
		}
		if returned {
			require.Error(t, early, "count %d: a duplicate report acknowledged while the first one's record was not durable", count)
		}
		close(walGo)
		require.ErrorIs(t, <-first, errReportLost, "count %d", count)
		if !returned {
			require.Error(t, <-second, "count %d: the report's record never reached the disk", count)
		}
		fs.Inject(nil)
		_ = e.Close()
	}
}

// TestTxnDecideRetryAnsweredWithoutEtcd: a Decide resent after its answer was lost (what
// docs/cluster.md tells a coordinator to do) is answered with the recorded decision even
// while the lease checker fails (etcd unreachable) or the lease has expired since: the
// compare-and-set answers what is recorded, and only a new record needs the lease check.
func TestTxnDecideRetryAnsweredWithoutEtcd(t *testing.T) {
	leases := &memLeases{}
	s := newTxnStore(t, Options{LeaseChecker: leases})
	ctx := context.Background()
	s.primaryPart(t, txnID(1), 5)
	s.primaryPart(t, txnID(2), 5)
	d, err := s.e.DecideTxn(ctx, txnID(1), 5, base.DecisionCommit, 2)
	require.NoError(t, err)
	require.Equal(t, base.DecisionCommit, d)

	leases.mu.Lock()
	leases.err = errors.New("etcd unreachable")
	leases.mu.Unlock()
	d, err = s.e.DecideTxn(ctx, txnID(1), 5, base.DecisionCommit, 2)
	require.NoError(t, err, "the recorded commit, answered without asking etcd")
	require.Equal(t, base.DecisionCommit, d)
	d, err = s.e.DecideTxn(ctx, txnID(1), 5, base.DecisionAbort, 2)
	require.ErrorIs(t, err, ErrTxnDecided)
	require.Equal(t, base.DecisionCommit, d)

	// Nothing recorded: still no decision without the lease check.
	_, err = s.e.DecideTxn(ctx, txnID(2), 5, base.DecisionCommit, 2)
	require.Error(t, err)
	require.NotErrorIs(t, err, ErrTxnDecided)
	require.Equal(t, base.DecisionNone, s.e.TxnStatus(txnID(2)).Primary)

	leases.mu.Lock()
	leases.err = nil
	leases.mu.Unlock()
	leases.kill(5)
	d, err = s.e.DecideTxn(ctx, txnID(1), 5, base.DecisionCommit, 2)
	require.NoError(t, err, "the recorded commit, its lease expired since")
	require.Equal(t, base.DecisionCommit, d)
}

// TestTxnClusterGrantWaitsForResolution: a partition (a cluster table) with rows of a
// transaction in doubt is not granted to another owner until the transaction is resolved
// (issue 15: "partitions with in-doubt transactions are neither granted nor moved"), as a
// local table's Acquire already refuses: the new owner would cache the committed versions of
// rows the pending decision may still change. The etcd grant is RegisterGrant's path.
func TestTxnClusterGrantWaitsForResolution(t *testing.T) {
	v := newMemVerifier()
	e := openTest(t, Options{GrantVerifier: v, TxnResolveInterval: -1})
	ti, err := e.CreateClusterTable(base.PartitionTableName("acct", 1), 64, testLayout)
	require.NoError(t, err)
	ctx := context.Background()
	const a, b = 11, 22
	ea := v.grant("acct", 1, a)
	_, err = e.RegisterGrant(ctx, ti.ID, a, ea)
	require.NoError(t, err)
	first, _, err := e.AllocIDs(ti.ID, a, ea, 1)
	require.NoError(t, err)
	s := &txnStore{e: e, table: ti.ID, epoch: ea, owner: a}
	s.requirePrepared(t, txnID(1), 3, "", 0, first, 7)

	_, err = e.RegisterGrant(ctx, ti.ID, a, ea)
	require.NoError(t, err, "a renewal of the current grant")

	// a restarts (the same owner id, a new session: its cache is empty) and is granted
	// again in etcd: its new grant waits too, or it would read the committed version of a
	// row a pending commit still changes, and write it back over that commit later.
	ea2 := v.grant("acct", 1, a)
	_, err = e.RegisterGrant(ctx, ti.ID, a, ea2)
	require.ErrorIs(t, err, ErrTxnLocked, "the same owner's new grant with a transaction in doubt")

	eb := v.grant("acct", 1, b) // a's lease ran out in etcd: b is the owner there
	_, err = e.RegisterGrant(ctx, ti.ID, b, eb)
	require.ErrorIs(t, err, ErrTxnLocked, "granted with a transaction in doubt")
	require.NoError(t, e.ApplyTxn(txnID(1), base.DecisionAbort))
	_, err = e.RegisterGrant(ctx, ti.ID, b, eb)
	require.NoError(t, err, "resolved: granted")
}

// TestTxnAbortBeforePrepare: a coordinator that gave up waiting for a prepare aborts every
// participant; the prepare, on a goroutine of its own at the participant, may land after
// that abort (an unknown transaction: a no-op). It is then refused (ErrTxnDecided, nothing
// locked, its seq not taken) instead of holding its rows until a resolver hears the
// primary's abort, or, once the primary forgot it, until the coordinator's lease ends. The
// memory of such aborts is bounded (MaxTxns) and kept TxnAbortKeep.
func TestTxnAbortBeforePrepare(t *testing.T) {
	clock := fakeClock{}
	s := newTxnStore(t, Options{Now: clock.Now, TxnAbortKeep: time.Minute, MaxTxns: 4})
	require.NoError(t, s.e.ApplyTxn(txnID(1), base.DecisionAbort), "an abort of a transaction not prepared here")
	_, err := s.prepare(t, txnID(1), 3, "", 0, 1, 5)
	require.ErrorIs(t, err, ErrTxnDecided, "the late prepare")
	s.seq--
	parts, _ := s.e.TxnCounts()
	require.Zero(t, parts)
	s.put(t, 1, 6) // not locked; the refused prepare's seq is this commit's
	require.Equal(t, uint64(6), s.get(t, 1))

	for i := byte(10); i < 20; i++ {
		require.NoError(t, s.e.ApplyTxn(txnID(i), base.DecisionAbort))
		clock.Advance(time.Millisecond) // each older than the next
	}
	_, err = s.prepare(t, txnID(19), 3, "", 0, 2, 5)
	require.ErrorIs(t, err, ErrTxnDecided, "the newest is kept")
	s.seq--
	_, err = s.prepare(t, txnID(10), 3, "", 0, 3, 5)
	require.NoError(t, err, "bounded by MaxTxns: the oldest gave way")
	clock.Advance(time.Minute)
	_, err = s.prepare(t, txnID(19), 3, "", 0, 2, 5)
	require.NoError(t, err, "past TxnAbortKeep it is forgotten")
}
