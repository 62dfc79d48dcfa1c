package txnode

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/logicpage"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/txnode/store"
)

// memGrants is an in-memory txncoord.Grants and, for the storage engine, the GrantVerifier that
// agrees with it: the owner keys etcd would hold. cluster/fencetest runs the real ones.
type memGrants struct {
	mu        sync.Mutex
	rev       uint64
	keys      map[string][2]uint64 // "table/p" -> owner, revision
	owner     uint64
	lost      atomic.Bool // the grants' check fails while set
	calls     atomic.Int64
	releases  atomic.Int64
	staleNext uint64 // under mu: the next Grant's revision, when set
}

func (g *memGrants) Grant(ctx context.Context, table string, p uint32) (uint64, func() error, func(context.Context) error, error) {
	g.calls.Add(1)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.rev++
	rev := g.rev
	if g.staleNext != 0 { // a grant below what the store has seen (as a restored copy's floor)
		rev, g.staleNext = g.staleNext, 0
	}
	key := fmt.Sprintf("%s/%d", table, p)
	g.keys[key] = [2]uint64{g.owner, rev}
	release := func(context.Context) error {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.keys[key][1] == rev {
			delete(g.keys, key)
		}
		g.releases.Add(1)
		return nil
	}
	return rev, func() error {
		if g.lost.Load() {
			return errors.New("grant lost")
		}
		return nil
	}, release, nil
}

func (g *memGrants) VerifyGrant(ctx context.Context, table string, p uint32, owner, epoch uint64) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if k := g.keys[fmt.Sprintf("%s/%d", table, p)]; k != [2]uint64{owner, epoch} {
		return fmt.Errorf("not the owner key: %w", storenode.ErrFenced)
	}
	return nil
}

func (g *memGrants) Revision(context.Context) (uint64, error) { return g.rev, nil }

// grantStoreAcct is grantStore with partition 0 of a cluster table "acct" (one partition of
// one stripe page) created in the store; it returns the partition's name and id there.
func grantStoreAcct(t *testing.T, ctx context.Context, owner uint64) (*memGrants, store.Store, string, uint32) {
	t.Helper()
	g, st := grantStore(t, owner)
	name := base.PartitionTableName("acct", 0)
	ti, err := st.CreateClusterTable(ctx, name, 64, base.ClusterLayout{Partitions: 1, StripePages: 1})
	require.NoError(t, err)
	return g, st, name, ti.ID
}

// grantOther registers owner other's grant of key ("table/p"), newer than any before, in g
// and at st (table, st's id of the partition), failing the test on error: a fence of
// this node's grant that its own check has not heard of.
func (g *memGrants) grantOther(t testing.TB, ctx context.Context, st store.Store, key string, table uint32, other uint64) {
	t.Helper()
	g.mu.Lock()
	g.rev++
	rev := g.rev
	g.keys[key] = [2]uint64{other, rev}
	g.mu.Unlock()
	_, err := st.Acquire(ctx, table, other, rev, store.AcquireEtcdGrant)
	require.NoError(t, err)
}

// openRenewing opens a DB of opts whose grant renewals run on the test's ticks: a send on
// tick starts one, and renewed gets each re-registration's error.
func openRenewing(t testing.TB, ctx context.Context, opts Options) (db *DB, tick chan time.Time, renewed chan error) {
	t.Helper()
	tick, renewed = make(chan time.Time), make(chan error, 1)
	opts.renewTick = tick
	opts.renewed = func(_ string, err error) { renewed <- err }
	return openDB(t, ctx, opts), tick, renewed
}

// grantStore is an embedded store in a fresh directory whose grants g verifies: a memGrants
// of owner at revision 10.
func grantStore(t *testing.T, owner uint64) (*memGrants, store.Store) {
	t.Helper()
	g := &memGrants{keys: map[string][2]uint64{}, owner: owner, rev: 10}
	st, err := store.OpenEmbedded(storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone, GrantVerifier: g})
	require.NoError(t, err)
	return g, st
}

// A cluster-managed table is served under the grant the node's grants give (registered with
// the store, which verifies it): its ids are its partition's, and once the grant's check
// fails, cached reads and writes fail with ErrLeaseExpired. Without grants (txncoord.Open's) the
// table does not open.
func TestClusterTableServedUnderGrant(t *testing.T) {
	ctx := context.Background()
	const owner = 0x42
	g := &memGrants{keys: map[string][2]uint64{}, owner: owner, rev: 10}
	dir := t.TempDir()
	st, err := store.OpenEmbedded(storenode.Options{Dir: dir, Sync: storenode.SyncNone, GrantVerifier: g})
	require.NoError(t, err)
	layout := base.ClusterLayout{Partitions: 4, StripePages: 1, Partition: 2}
	_, err = st.CreateClusterTable(ctx, base.PartitionTableName("acct", 2), 64, layout)
	require.NoError(t, err)

	plain := openDB(t, ctx, Options{Store: st, OwnerID: owner})
	_, err = plain.Table(ctx, base.PartitionTableName("acct", 2))
	require.ErrorContains(t, err, "this node has none")
	require.NoError(t, plain.Close(ctx))

	st, err = store.OpenEmbedded(storenode.Options{Dir: dir, Sync: storenode.SyncNone, GrantVerifier: g})
	require.NoError(t, err)
	db := openDB(t, ctx, Options{Store: st, OwnerID: owner, grants: g})
	defer db.Close(ctx)
	tb := openTable(t, ctx, db, base.PartitionTableName("acct", 2))
	require.EqualValues(t, 1, g.calls.Load())
	sl := base.ClusterLayout(layout)
	var ids []uint64
	for i := range 100 {
		id := insertRow(t, ctx, tb, row(uint64(i)))
		require.Equal(t, uint32(2), sl.PartitionOf(id), "id %d", id)
		ids = append(ids, id)
	}
	dst := make([]byte, 64)
	require.NoError(t, tb.Get(ctx, ids[0], dst))
	require.Equal(t, row(0), dst)

	g.lost.Store(true)
	require.ErrorIs(t, tb.Get(ctx, ids[0], dst), ErrLeaseExpired)
	_, err = tb.Insert(ctx, row(1000))
	require.ErrorIs(t, err, ErrLeaseExpired)
	require.ErrorIs(t, tb.Update(ctx, ids[1], func([]byte) error { return nil }), ErrLeaseExpired)
}

// A grant the store fences at registration (below its floor: a restored copy's, or another
// owner registered a higher one) is released and taken again, once, as a new grant; Close
// releases the grants.
func TestClusterGrantFencedAtRegistrationRetried(t *testing.T) {
	ctx := context.Background()
	const owner, other = 0x42, 0x43
	g := &memGrants{keys: map[string][2]uint64{}, owner: other, rev: 10}
	st, err := store.OpenEmbedded(storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone, GrantVerifier: g})
	require.NoError(t, err)
	ti, err := st.CreateClusterTable(ctx, base.PartitionTableName("acct", 0), 64, base.ClusterLayout{Partitions: 1, StripePages: 1})
	require.NoError(t, err)
	// Another owner registered revision 11; its grant is released in etcd (the key goes).
	epoch, _, release, err := g.Grant(ctx, "acct", 0)
	require.NoError(t, err)
	_, err = st.Acquire(ctx, ti.ID, other, epoch, store.AcquireEtcdGrant)
	require.NoError(t, err)
	require.NoError(t, release(ctx))

	g.mu.Lock()
	g.owner, g.staleNext = owner, 5
	g.mu.Unlock()
	db := openDB(t, ctx, Options{Store: st, OwnerID: owner, grants: g})
	tb, err := db.Table(ctx, base.PartitionTableName("acct", 0))
	require.NoError(t, err, "the fenced grant was released and a new one taken")
	require.EqualValues(t, 3, g.calls.Load())
	require.EqualValues(t, 2, g.releases.Load())
	insertRow(t, ctx, tb, row(1))
	require.NoError(t, db.Close(ctx))
	require.EqualValues(t, 3, g.releases.Load(), "Close releases the grant")
}

// Once the store fences this node's grant of a cluster-managed table (a newer grant is
// registered there: another owner's, while this node's etcd check has not noticed yet; or
// the store is a restored copy whose floor is above it), no check of the grant can make it
// current again: the table stops serving, cached reads included, as a local table does once
// the store refuses its renewal. Here the other owner registers, this node's next write is
// fenced (a commit batch, or an id grant), and its cached row is no longer served.
func TestClusterTableFencedByStoreStopsServing(t *testing.T) {
	for _, write := range []string{"commit", "id grant"} {
		t.Run(write, func(t *testing.T) {
			ctx := context.Background()
			const owner, other = 0x42, 0x43
			g, st, name, table := grantStoreAcct(t, ctx, owner)
			db := openDB(t, ctx, Options{Store: st, OwnerID: owner, grants: g})
			defer db.Close(ctx)
			tb := openTable(t, ctx, db, name)
			// A page of rows: the next insert needs ids of a page of its own (an id grant),
			// and this page's frame stays cached and valid.
			var ids []uint64
			for i := range logicpage.RowsPerPage {
				id := insertRow(t, ctx, tb, row(uint64(i)))
				ids = append(ids, id)
			}
			dst := make([]byte, 64)
			require.NoError(t, tb.Get(ctx, ids[0], dst))

			// The other owner's grant, newer, registered at the store; this node's check
			// still vouches (it has not heard).
			g.grantOther(t, ctx, st, "acct/0", table, other)

			var err error
			if write == "commit" {
				err = tb.Put(ctx, ids[1], row(100))
			} else {
				_, err = tb.Insert(ctx, row(100))
			}
			require.ErrorIs(t, err, storenode.ErrFenced)
			require.ErrorIs(t, tb.Get(ctx, ids[0], dst), ErrLeaseExpired, "a cached read after the store fenced the grant")
			_, err = tb.Insert(ctx, row(3))
			require.ErrorIs(t, err, ErrLeaseExpired)
		})
	}
}

// DropTable of an open cluster-managed table gives its etcd grant up (on cfcf39b it stayed
// held until the session ended, keeping every other node from the partition).
func TestDropClusterTableReleasesGrant(t *testing.T) {
	ctx := context.Background()
	const owner = 0x42
	g, st := grantStore(t, owner)
	db := openDB(t, ctx, Options{Store: st, OwnerID: owner, grants: g})
	defer db.Close(ctx)
	tb, _ := acctTable(t, ctx, db)
	insertRow(t, ctx, tb, row(1))
	require.NoError(t, db.DropTable(ctx, base.PartitionTableName("acct", 0)))
	require.EqualValues(t, 1, g.releases.Load(), "the dropped table's grant is released")
	g.mu.Lock()
	_, held := g.keys["acct/0"]
	g.mu.Unlock()
	require.False(t, held, "the owner key is gone")
}

// closingStore is a store whose Acquire, once the real one answered, waits until Close
// began closing the store: an open still registering its grant when DB.Close runs.
type closingStore struct {
	store.Store
	acquired chan struct{} // closed once an Acquire answered
	closing  chan struct{} // closed by Close
}

func (s *closingStore) Acquire(ctx context.Context, table uint32, owner, epoch uint64, flags store.AcquireFlags) (base.Grant, error) {
	g, err := s.Store.Acquire(ctx, table, owner, epoch, flags)
	close(s.acquired)
	<-s.closing
	return g, err
}

func (s *closingStore) Close() error {
	close(s.closing)
	return s.Store.Close()
}

// An open of a cluster-managed table that registers its grant after Close gave the grants up
// gives its own up too and fails with ErrClosed (on cfcf39b it returned the table and the
// grant stayed held until the session ended).
func TestCloseDuringClusterOpenReleasesGrant(t *testing.T) {
	ctx := context.Background()
	const owner = 0x42
	g, es := grantStore(t, owner)
	name := base.PartitionTableName("acct", 0)
	_, err := es.CreateClusterTable(ctx, name, 64, base.ClusterLayout{Partitions: 1, StripePages: 1})
	require.NoError(t, err)
	cs := &closingStore{Store: es, acquired: make(chan struct{}), closing: make(chan struct{})}
	db := openDB(t, ctx, Options{Store: cs, OwnerID: owner, grants: g})
	opened := make(chan error, 1)
	go func() {
		_, err := db.Table(ctx, name)
		opened <- err
	}()
	<-cs.acquired
	require.NoError(t, db.Close(ctx))
	require.ErrorIs(t, <-opened, ErrClosed)
	require.EqualValues(t, 1, g.releases.Load(), "the grant the open took is released")
}

// A node that only reads a cluster-managed table hears of the store's fence at its next
// periodic re-registration of the grant (renewGrant), not only at a write: here another
// owner's newer grant is registered at the store, or the table is dropped there, while this
// node's etcd check still vouches; after one renewal tick its cached row is no longer served
// (on cfcf39b cluster tables had no renewal: the cached read kept succeeding).
func TestClusterTableReaderHearsStoreFence(t *testing.T) {
	for _, how := range []string{"newer grant", "dropped"} {
		t.Run(how, func(t *testing.T) {
			ctx := context.Background()
			const owner, other = 0x42, 0x43
			g, st, name, table := grantStoreAcct(t, ctx, owner)
			db, tick, renewed := openRenewing(t, ctx, Options{Store: st, OwnerID: owner, grants: g})
			defer db.Close(ctx)
			tb := openTable(t, ctx, db, name)
			id := insertRow(t, ctx, tb, row(7))
			dst := make([]byte, 64)
			require.NoError(t, tb.Get(ctx, id, dst))

			// A renewal while nothing changed: the store agrees, the table serves.
			renew := func() error {
				t.Helper()
				timeout := time.NewTimer(time.Minute)
				defer timeout.Stop()
				select {
				case tick <- time.Time{}:
				case <-timeout.C:
					t.Fatal("no renewal loop took the tick")
				}
				select {
				case err := <-renewed:
					return err
				case <-timeout.C:
					t.Fatal("no re-registration ended")
				}
				return nil
			}
			require.NoError(t, renew())
			require.NoError(t, tb.Get(ctx, id, dst))
			require.EqualValues(t, 1, db.Stats().Renewals)

			if how == "newer grant" {
				g.grantOther(t, ctx, st, "acct/0", table, other)
			} else {
				// Dropped at the store behind this DB's back (the embedded store's grants
				// never lapse, so only this owner id may drop it here; a storage node lets
				// anyone once its own lease of the table ran out, which a cluster table's
				// never renews).
				require.NoError(t, st.DropTable(ctx, name, owner))
			}
			require.NoError(t, tb.Get(ctx, id, dst), "cached: served until the node hears")

			rerr := renew()
			if how == "newer grant" {
				require.ErrorIs(t, rerr, storenode.ErrFenced)
				require.ErrorIs(t, tb.Get(ctx, id, dst), ErrLeaseExpired, "a cached read after the store fenced the grant")
				require.ErrorIs(t, tb.servingErr(), storenode.ErrFenced)
			} else {
				require.ErrorIs(t, rerr, storenode.ErrTableNotFound)
				require.ErrorIs(t, tb.Get(ctx, id, dst), ErrTableNotFound, "a cached read of a table dropped at the store")
				require.ErrorIs(t, tb.servingErr(), ErrTableNotFound)
			}
			_, err := tb.Insert(ctx, row(8))
			require.Error(t, err)

			// Latched: later ticks do not ask the store again, nor revive the table.
			require.NoError(t, renew())
			require.Error(t, tb.Get(ctx, id, dst))
			require.EqualValues(t, 1, db.Stats().RenewalFailures)
		})
	}
}
