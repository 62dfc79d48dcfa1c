//go:build unix

package node_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/node"
)

// Node.Update's closure error rests on what it read: as txnode.DB.Update does (and as
// Node.Update over one storage node did before the two-phase commit), it is returned only
// once those rows are durable. Here the storage node (a child process) is stopped (SIGSTOP),
// so a local commit of x is installed in the cache but not durable; a closure that reads the
// new x and fails on it must not return that error while the commit may still be lost: its
// Update waits (here until its context ends).
func TestUpdateClosureErrorWaitsForDurableReads(t *testing.T) {
	ctx := testCtx(t)
	tc := startTxnCluster(t, 0, nil)
	child := startStoreProc(t, tc.etcd.Endpoints()[0], "127.0.0.1:0", storeTwoPhase) // killed (a stopped one too) at the test's end
	addr := child.Addr
	a := tc.openConfig(t, node.Config{Session: cluster.SessionConfig{Owner: 0xa, Addr: "game-a:7000"}, RequestTimeout: 60 * time.Second})
	ta := createTable(t, ctx, a, "acct", 64, 1, 1, []string{addr})
	require.NoError(t, ta.Own(ctx, 0))
	x := insertRow(t, ctx, ta, acctRow(0, 0))

	// Stop returns once every thread of the storage node has stopped: with the signal only
	// sent, on a loaded machine it could still answer the deposit's commit.
	child.Stop()
	deposit := make(chan error, 1)
	go func() {
		deposit <- a.Update(ctx, func(tx *node.Tx) error { return tx.Put(ta, x, acctRow(100, 0)) })
	}()
	errRich, errNotYet := errors.New("rich"), errors.New("deposit not installed yet")
	// richOrNot reads x and fails: errRich once the deposit is installed, else errNotYet.
	richOrNot := func(tx *node.Tx) error {
		d := make([]byte, 64)
		if err := tx.Get(ta, x, d); err != nil {
			return err
		}
		if balanceOf(d) == 100 {
			return errRich
		}
		return errNotYet
	}
	waited := false
	start := time.Now()
	for !waited {
		require.Less(t, time.Since(start), 30*time.Second, "the deposit never installed x") // a bound, not a synchronisation
		uctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		err := a.Update(uctx, richOrNot)
		cancel()
		switch {
		case errors.Is(err, errNotYet):
			continue // the deposit's commit has not installed x yet
		case errors.Is(err, context.DeadlineExceeded):
			waited = true
		default:
			require.NotErrorIs(t, err, errRich, "an error resting on a commit not durable (it may still be lost)")
			require.NoError(t, err)
		}
	}
	child.Cont()
	require.NoError(t, <-deposit)
	err := a.Update(ctx, richOrNot)
	require.ErrorIs(t, err, errRich, "durable now: the closure's error is returned")
}
