package txnode

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Lease renewals keep up while the node is flooded: goroutines reading cached rows keep both
// cores busy (a goroutine that wakes up waits behind them for its turn, about 10 ms each per
// core), others stream commits to a storage node in another process (this test binary,
// TestHelperStorageNode) over 127.0.0.1, which checkpoints every MiB of WAL. The lease is 6 s:
// renewals every 1.5 s. No renewal may fail and the table stays served. The storage node
// answers a renewal in microseconds; the time went on the client side: the renewal waited for
// its sender goroutine, which yielded (to the back of the run queue) before writing, then for
// its receiver, woken by the network poller (to the back again), and was given up a quarter
// lease after it started. Fails on 35ab947: renewals failed with "outcome unknown: context
// deadline exceeded" (measured in crudbench's cache-hit query-random phase: 1.7-2.2 s per
// renewal, at a 10 s lease).
func TestRenewalsUnderLoad(t *testing.T) {
	readers, writers, rounds := 128, 8, 5
	if testing.Short() {
		readers, writers, rounds = 16, 2, 3
	}
	const lease = 6 * time.Second
	t.Setenv(helperLeaseEnv, lease.String())
	addr := freeLoopbackAddr(t)
	node := startNodeProc(t, t.TempDir(), addr)
	t.Cleanup(node.kill)
	ctx := context.Background()
	db := openDB(t, ctx, Options{StoreAddr: addr, OwnerID: 77, CacheBytes: 64 << 20})
	defer db.Close(ctx)
	require.Equal(t, lease, db.info.Lease)
	tab := newTable(t, ctx, db, "t", 64)
	ids := make([]uint64, 4096)
	for i := range ids {
		ids[i] = insertRow(t, ctx, tab, row(uint64(i)))
	}

	var stop atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, readers+writers+1)
	for g := range readers {
		wg.Go(func() {
			buf := make([]byte, 64)
			for i := g; !stop.Load(); i++ {
				if err := tab.Get(ctx, ids[i%len(ids)], buf); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for g := range writers {
		wg.Go(func() {
			for i := g; !stop.Load(); i += writers {
				if err := tab.Update(ctx, ids[i%len(ids)], func(r []byte) error { r[8]++; return nil }); err != nil {
					errs <- err
					return
				}
			}
		})
	}

	// rounds renewal periods of load (the load's length, not a synchronisation).
	start := db.Stats().Renewals
	load := time.NewTimer(time.Duration(rounds) * lease / 4)
	defer load.Stop()
	var failed error
	select {
	case <-load.C:
	case failed = <-errs:
	}
	stop.Store(true)
	wg.Wait()
	require.NoError(t, failed)
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	st := db.Stats()
	require.Zero(t, st.RenewalFailures, "a lease renewal failed under load")
	require.Greater(t, st.Renewals, start, "renewals ran during the load")
	buf := make([]byte, 64)
	require.NoError(t, tab.Get(ctx, ids[0], buf), "the table is still served")
}
