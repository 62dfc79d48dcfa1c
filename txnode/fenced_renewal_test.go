package txnode

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/txnode/store"
)

// fencingStore is an embedded store that reports a lease (so the node renews it) and, once
// fence is set, answers every renewal with ErrFenced: the table was granted since (another
// owner, or a restored backup's epoch bump).
type fencingStore struct {
	store.Store
	lease    time.Duration
	fence    atomic.Bool
	renewals atomic.Int64
}

func (s *fencingStore) Info() store.Info {
	i := s.Store.Info()
	i.Lease = s.lease
	return i
}

func (s *fencingStore) Acquire(ctx context.Context, table uint32, owner, epoch uint64) (store.Grant, error) {
	if epoch != 0 {
		s.renewals.Add(1)
		if s.fence.Load() {
			return store.Grant{}, storenode.ErrFenced
		}
	}
	g, err := s.Store.Acquire(ctx, table, owner, epoch)
	g.Lease = s.lease
	return g, err
}

// TestFencedRenewalStopsServing: a lease renewal answered with ErrFenced makes the node stop
// serving the table at once (its cache may hold rows the store does not), though its lease
// has not run out on its clock. On 26994d0 it went on serving cached rows until the lease
// ran out.
func TestFencedRenewalStopsServing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	inner, err := store.OpenEmbedded(storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone})
	require.NoError(t, err)
	st := &fencingStore{Store: inner, lease: 80 * time.Millisecond}
	clock := &fakeLeaseClock{} // frozen: the lease never runs out by time
	db, err := Open(ctx, Options{Store: st, clock: clock})
	require.NoError(t, err)
	defer db.Close(ctx)
	tb, err := db.CreateTable(ctx, "f", 64)
	require.NoError(t, err)
	id, err := tb.Insert(ctx, u64Row(64, 1))
	require.NoError(t, err)
	buf := make([]byte, 64)
	require.NoError(t, tb.Get(ctx, id, buf))

	st.fence.Store(true)
	seen := st.renewals.Load()
	for {
		// Counted before the read: a renewal counted then has started after the one before
		// it returned, so a read served after it is one too many.
		renewals := st.renewals.Load()
		err := tb.Get(ctx, id, buf)
		if err != nil {
			require.ErrorIs(t, err, ErrLeaseExpired)
			break
		}
		// Served only until a renewal after the fence has been answered.
		require.LessOrEqual(t, renewals, seen+1, "a fenced renewal did not stop the node serving")
		select {
		case <-ctx.Done():
			t.Fatal("the node kept serving its cache after a fenced renewal")
		case <-time.After(2 * time.Millisecond): // polling for the renewal goroutine
		}
	}
}
