package txnode

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/txnode/store"
)

// goneStore is an embedded store that reports a lease (so the node renews it) and, once gone
// is set, answers every renewal with ErrTableNotFound: the store no longer has the table (a
// restored backup taken before the table was created, or another node dropped it).
type goneStore struct {
	store.Store
	lease    time.Duration
	gone     atomic.Bool
	renewals atomic.Int64
}

func (s *goneStore) Info() store.Info {
	i := s.Store.Info()
	i.Lease = s.lease
	return i
}

func (s *goneStore) Acquire(ctx context.Context, table uint32, owner, epoch uint64) (store.Grant, error) {
	if epoch != 0 {
		s.renewals.Add(1)
		if s.gone.Load() {
			return store.Grant{}, storenode.ErrTableNotFound
		}
	}
	g, err := s.Store.Acquire(ctx, table, owner, epoch)
	g.Lease = s.lease
	return g, err
}

// TestGoneRenewalStopsServing: a lease renewal answered with ErrTableNotFound makes the node
// stop serving the table at once, as a fenced one does: the store it renews with has no such
// table, so every cached row is one the store does not have. On 71787ea it went on serving
// them until the lease ran out.
func TestGoneRenewalStopsServing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	inner, err := store.OpenEmbedded(storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone})
	require.NoError(t, err)
	st := &goneStore{Store: inner, lease: 80 * time.Millisecond}
	clock := &fakeLeaseClock{} // frozen: the lease never runs out by time
	db, err := Open(ctx, Options{Store: st, clock: clock})
	require.NoError(t, err)
	defer db.Close(ctx)
	tb, err := db.CreateTable(ctx, "late", 64)
	require.NoError(t, err)
	id, err := tb.Insert(ctx, u64Row(64, 1))
	require.NoError(t, err)
	buf := make([]byte, 64)
	require.NoError(t, tb.Get(ctx, id, buf))

	st.gone.Store(true)
	seen := st.renewals.Load()
	for {
		// Counted before the read: a renewal counted then has started after the one before
		// it returned, so a read served after it is one too many.
		renewals := st.renewals.Load()
		err := tb.Get(ctx, id, buf)
		if err != nil {
			require.True(t, errors.Is(err, ErrLeaseExpired), "%v", err)
			break
		}
		require.LessOrEqual(t, renewals, seen+1, "a renewal that found no table did not stop the node serving")
		select {
		case <-ctx.Done():
			t.Fatal("the node kept serving its cache after a renewal found no table")
		case <-time.After(2 * time.Millisecond): // polling for the renewal goroutine
		}
	}
}
