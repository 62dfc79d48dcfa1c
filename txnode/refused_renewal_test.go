package txnode

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/txnode/store"
)

// refusingStore is an embedded store that reports a lease (so the node renews it) and, once
// refuse is set, answers every renewal with refusal: the table was granted since (ErrFenced:
// another owner, or a restored backup's epoch bump) or is gone (ErrTableNotFound: a restored
// backup taken before the table was created, or another node dropped it).
type refusingStore struct {
	store.Store
	lease    time.Duration
	refusal  error
	refuse   atomic.Bool
	renewals atomic.Int64
}

func (s *refusingStore) Info() store.Info {
	i := s.Store.Info()
	i.Lease = s.lease
	return i
}

func (s *refusingStore) Acquire(ctx context.Context, table uint32, owner, epoch uint64, flags store.AcquireFlags) (base.Grant, error) {
	if epoch != 0 {
		s.renewals.Add(1)
		if s.refuse.Load() {
			return base.Grant{}, s.refusal
		}
	}
	g, err := s.Store.Acquire(ctx, table, owner, epoch, flags)
	g.Lease = s.lease
	return g, err
}

// TestRefusedRenewalStopsServing: a lease renewal answered with ErrFenced or ErrTableNotFound
// makes the node stop serving the table at once (its cache may hold rows the store does not),
// though its lease has not run out on its clock. ErrFenced failed on 26994d0 and
// ErrTableNotFound on 71787ea: the node went on serving cached rows until the lease ran out.
func TestRefusedRenewalStopsServing(t *testing.T) {
	for _, refusal := range []error{storenode.ErrFenced, storenode.ErrTableNotFound} {
		t.Run(refusal.Error(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			inner, err := store.OpenEmbedded(storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone})
			require.NoError(t, err)
			st := &refusingStore{Store: inner, lease: 80 * time.Millisecond, refusal: refusal}
			clock := &fakeLeaseClock{} // frozen: the lease never runs out by time
			db := openDB(t, ctx, Options{Store: st, clock: clock})
			defer db.Close(ctx)
			tb := newTable(t, ctx, db, "f", 64)
			id := insertRow(t, ctx, tb, u64Row(64, 1))
			buf := make([]byte, 64)
			require.NoError(t, tb.Get(ctx, id, buf))

			st.refuse.Store(true)
			seen := st.renewals.Load()
			for {
				// Counted before the read: a renewal counted then has started after the one
				// before it returned, so a read served after it is one too many.
				renewals := st.renewals.Load()
				err := tb.Get(ctx, id, buf)
				if err != nil {
					require.ErrorIs(t, err, ErrLeaseExpired)
					break
				}
				// Served only until a renewal after the refusal has been answered.
				require.LessOrEqual(t, renewals, seen+1, "a refused renewal did not stop the node serving")
				select {
				case <-ctx.Done():
					t.Fatal("the node kept serving its cache after a refused renewal")
				case <-time.After(2 * time.Millisecond): // polling for the renewal goroutine
				}
			}
		})
	}
}
