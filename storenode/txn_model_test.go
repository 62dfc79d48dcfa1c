package storenode

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/testseed"
)

// TestTxnConcurrentTransfers: workers (one owner and one table per store each) run transfers
// between two stores by two-phase commit, concurrently, each one finishing in one of four
// ways: committed, aborted, the coordinator dying before the decision, or dying after it
// with only the primary told. Meanwhile the engines' background resolvers run, and
// checkpoints (carrying the transactions in doubt) run in a loop. Then every lease dies, the
// resolvers finish everything, and every row is what the workers' model says: each transfer
// applied on both stores exactly when its primary recorded commit. WEFT_SEED replays.
func TestTxnConcurrentTransfers(t *testing.T) {
	seed, ok := testseed.Replay(t)
	if !ok {
		seed = rand.Uint64()
	}
	t.Logf("WEFT_SEED=%d", seed)
	workers, transfers := testseed.Scaled(2, 4, 8), testseed.Scaled(30, 100, 1000)
	leases, peers, clock := &memLeases{}, &memPeers{}, &fakeClock{}
	// The engine clock moves with the checkpoint loop (1 ms a round), so the background
	// resolvers take parts in doubt during the run; the final pass moves it past every part.
	opts := Options{LeaseChecker: leases, TxnPeer: peers, TxnResolveAfter: time.Millisecond, TxnResolveInterval: 5 * time.Millisecond,
		CacheBytes: 1 << 20, Logger: quietLogger, Now: clock.Now}
	ea, eb := openTest(t, opts), openTest(t, opts)
	peers.set("a", ea)
	peers.set("b", eb)

	stop := make(chan struct{})
	var bg sync.WaitGroup
	bg.Add(1)
	go func() { // checkpoints racing the transactions
		defer bg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			clock.Advance(time.Millisecond)
			for _, e := range []*Engine{ea, eb} {
				if err := e.Checkpoint(); err != nil {
					t.Errorf("checkpoint: %v", err)
					return
				}
				if err := e.verify(); err != nil {
					t.Errorf("verify: %v", err)
					return
				}
			}
		}
	}()

	const rows = 16
	var nextLease atomic.Int64
	var wg sync.WaitGroup
	models := make([][2][rows]uint64, workers)
	stores := make([][2]*txnStore, workers)
	for w := range workers {
		stores[w] = [2]*txnStore{tableStore(t, ea, w), tableStore(t, eb, w)}
		for side := range 2 {
			for r := range rows {
				stores[w][side].put(t, uint64(r), 1000)
				models[w][side][r] = 1000
			}
		}
	}
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			a, b := stores[w][0], stores[w][1]
			m := &models[w]
			ctx := context.Background()
			for k := range transfers {
				id := base.TxnID{0: byte(w), 8: byte(k), 9: byte(k >> 8)}
				lease := nextLease.Add(1)
				ra, rb := uint64(rng.IntN(rows)), uint64(rng.IntN(rows))
				amount := uint64(rng.IntN(10) + 1)
				if _, err := a.prepare(t, id, lease, "", 0, ra, m[0][ra]-amount); err != nil {
					a.seq--
					if !errors.Is(err, ErrTxnLocked) {
						t.Errorf("prepare a: %v", err)
						return
					}
					continue // a row still in doubt: another transfer
				}
				if _, err := b.prepare(t, id, lease, "a", 1, rb, m[1][rb]+amount); err != nil {
					b.seq--
					if !errors.Is(err, ErrTxnLocked) {
						t.Errorf("prepare b: %v", err)
						return
					}
					if _, err := ea.DecideTxn(ctx, id, lease, base.DecisionAbort, 2); err != nil {
						t.Errorf("decide abort: %v", err)
					}
					if err := ea.ApplyTxn(id, base.DecisionAbort); err != nil {
						t.Errorf("apply abort: %v", err)
					}
					continue
				}
				switch rng.IntN(4) {
				case 0, 1: // commit, all told
					d, err := ea.DecideTxn(ctx, id, lease, base.DecisionCommit, 2)
					if err != nil || d != base.DecisionCommit {
						t.Errorf("decide commit: %v %v", d, err)
						return
					}
					m[0][ra] -= amount
					m[1][rb] += amount
					if err := ea.ApplyTxn(id, base.DecisionCommit); err != nil {
						t.Errorf("apply a: %v", err)
					}
					if err := eb.ApplyTxn(id, base.DecisionCommit); err != nil {
						t.Errorf("apply b: %v", err)
					}
				case 2: // the coordinator dies before deciding
					leases.kill(lease)
				case 3: // it decides commit, tells the primary only, and dies
					if _, err := ea.DecideTxn(ctx, id, lease, base.DecisionCommit, 2); err != nil {
						t.Errorf("decide commit: %v", err)
						return
					}
					m[0][ra] -= amount
					m[1][rb] += amount
					if rng.IntN(2) == 0 {
						if err := ea.ApplyTxn(id, base.DecisionCommit); err != nil {
							t.Errorf("apply a: %v", err)
						}
					}
					leases.kill(lease)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	bg.Wait()
	// Every coordinator is gone: the resolvers finish what is left.
	for l := int64(1); l <= nextLease.Load(); l++ {
		leases.kill(l)
	}
	clock.Advance(time.Second) // every part is older than TxnResolveAfter
	ctx := context.Background()
	for range 100 {
		pa, _ := ea.TxnCounts()
		pb, _ := eb.TxnCounts()
		if pa == 0 && pb == 0 {
			break
		}
		for _, e := range []*Engine{ea, eb} {
			// A background resolver may be applying a decision: a part is reported only
			// once its apply record is durable.
			e.mu.Lock()
			last := e.lastLSN
			e.mu.Unlock()
			require.NoError(t, e.waitDurable(last))
		}
		errB := eb.ResolveTxns(ctx)
		errA := ea.ResolveTxns(ctx)
		if errA != nil || errB != nil {
			t.Logf("resolve: a %v, b %v", errA, errB)
		}
	}
	for name, e := range map[string]*Engine{"a": ea, "b": eb} {
		e.mu.Lock()
		for id, p := range e.txnParts {
			t.Logf("left on %s: %v decision %v primary %q index %d lsn %d durable %d", name, id, p.decision, p.primary, p.index, p.lsn, e.durableThrough())
		}
		e.mu.Unlock()
	}
	for _, e := range []*Engine{ea, eb} {
		parts, _ := e.TxnCounts()
		require.Zero(t, parts, "every transaction resolved")
		require.NoError(t, e.verify())
	}
	sa, sb := ea.Stats(), eb.Stats()
	t.Logf("a: %d commits %d aborts, %d resolver aborts recorded; b: %d resolved; checkpoints %d/%d",
		sa.TxnCommits, sa.TxnAborts, sa.TxnResolverAborts, sb.TxnResolved, sa.Checkpoints, sb.Checkpoints)
	require.NotZero(t, sa.TxnCommits)
	require.NotZero(t, sb.TxnResolved, "some transfers were left to the resolvers")
	for w := range workers {
		for side := range 2 {
			for r := range rows {
				require.Equal(t, models[w][side][r], stores[w][side].get(t, uint64(r)), "worker %d store %d row %d", w, side, r)
			}
		}
	}
}

// tableStore makes worker w's table on e, held by owner 100+w.
func tableStore(t testing.TB, e *Engine, w int) *txnStore {
	info, err := e.CreateTable(fmt.Sprintf("w%d", w), 64)
	require.NoError(t, err)
	owner := uint64(100 + w)
	g := acquire(t, e, info.ID, owner, 0)
	requireGranted(t, e, info.ID, owner, g.Epoch)
	return &txnStore{e: e, table: info.ID, epoch: g.Epoch, owner: owner}
}
