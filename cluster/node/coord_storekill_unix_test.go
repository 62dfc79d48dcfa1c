//go:build unix

package node_test

import (
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/internal/testkit"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/txnode"
)

// A storage node (a child process) killed with -9 in the middle of transfers across storage
// nodes, and restarted over its directory at its address: the transfers go on once it is
// back (the transaction node's prepares, decisions and applies are sent again on the new
// connection, answered from what the storage node logged); at the end, every transaction is
// finished (the coordinator's node closed, the resolvers' passes run), the total is
// conserved, and the received counts hold every acknowledged transfer and at most those whose
// outcome was unknown besides.
func TestStorageNodeKilledDuringCrossNodeTransfers(t *testing.T) {
	testkit.SkipUnderRace(t, "a kill suite (child processes)")
	ctx := testCtx(t)
	before, after := 30, 30
	if testing.Short() {
		before, after = 12, 12
	}
	tc := startTxnCluster(t, 2, func(o *storenode.Options) {
		o.TxnResolveInterval = -1
		o.TxnResolveAfter = time.Millisecond
	})
	child := startStoreProc(t, tc.etcd.Endpoints()[0], "127.0.0.1:0", storeTwoPhase)
	childAddr := child.Addr
	addrs := append(append([]string(nil), tc.addrs...), childAddr)

	a := tc.openConfig(t, node.Config{Session: cluster.SessionConfig{Owner: 0xa, Addr: "game-a:7000"}, RequestTimeout: 30 * time.Second})
	ta := createTable(t, ctx, a, "acct", 64, partitions, 1, addrs)
	require.NoError(t, ta.Own(ctx, parts(partitions, 0)...))
	var ids, onChild []uint64
	for range 12 {
		id := insertRow(t, ctx, ta, acctRow(initial, 0))
		ids = append(ids, id)
		if ta.NodeOf(id) == childAddr {
			onChild = append(onChild, id)
		}
	}
	require.NotEmpty(t, onChild)

	var acked, unknown atomic.Int64
	ackCh := make(chan struct{}, 1)
	var otherErrs []error
	var mu sync.Mutex
	stop := make(chan struct{})
	reached := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 3))
			for {
				select {
				case <-stop:
					return
				default:
				}
				// One end on the child's storage node, the other elsewhere.
				from := onChild[rng.IntN(len(onChild))]
				to := ids[rng.IntN(len(ids))]
				for ta.NodeOf(to) == childAddr {
					to = ids[rng.IntN(len(ids))]
				}
				if rng.IntN(2) == 0 {
					from, to = to, from
				}
				err := xfer(ctx, a, ta, from, to, uint64(1+rng.IntN(20)))
				switch {
				case err == nil:
					if acked.Add(1) == int64(before) {
						once.Do(func() { close(reached) })
					}
					select {
					case ackCh <- struct{}{}:
					default:
					}
				case errors.Is(err, txnode.ErrUnknownOutcome):
					unknown.Add(1)
				default:
					mu.Lock()
					otherErrs = append(otherErrs, err)
					mu.Unlock()
				}
			}
		}()
	}
	select {
	case <-reached:
	case <-ctx.Done():
		t.Fatal("no transfers")
	}
	child.restart()
	mark := acked.Load()
	// The transfers go on through the restarted storage node (each has an end there).
	for acked.Load() < mark+int64(after) {
		select {
		case <-ackCh:
		case <-ctx.Done():
			mu.Lock()
			t.Fatalf("transfers did not go on after the restart: %d acknowledged since, errors %v", acked.Load()-mark, otherErrs)
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("acknowledged %d, unknown %d, failed %d", acked.Load(), unknown.Load(), len(otherErrs))
	require.NoError(t, a.Close(ctx)) // its lease revoked: the resolvers finish what it left

	for pass := 0; ; pass++ {
		left := child.resolve(ctx)
		for _, srv := range tc.srvs {
			require.NoError(t, srv.Engine().ResolveTxns(ctx))
			p, _ := srv.Engine().TxnCounts()
			left += p
		}
		if left == 0 {
			break
		}
		require.Less(t, pass, 200, "parts left in doubt: %d", left)
	}
	_, tr := tc.openNodeTable(t, ctx, 0xc, "acct")
	var bal, rec uint64
	dst := make([]byte, 64)
	for _, id := range ids {
		require.NoError(t, tr.Get(ctx, id, dst))
		bal += balanceOf(dst)
		rec += receivedOf(dst)
	}
	require.Equal(t, uint64(len(ids))*initial, bal, "the total is conserved")
	require.GreaterOrEqual(t, rec, uint64(acked.Load()), "every acknowledged transfer is there")
	require.LessOrEqual(t, rec, uint64(acked.Load()+unknown.Load()), "and only those, or ones of unknown outcome")
}
