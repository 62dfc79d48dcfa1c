package txnode

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/txnode/store"
)

// gateStore holds its first Read after arm until released, so a test can close the DB while
// a cache miss is on its way to the store.
type gateStore struct {
	store.Store
	armed   chan struct{} // closed by arm
	entered chan struct{} // the held Read arrived
	release chan struct{} // lets it go on
}

func newGateStore(s store.Store) *gateStore {
	return &gateStore{Store: s, armed: make(chan struct{}), entered: make(chan struct{}, 1), release: make(chan struct{})}
}

func (s *gateStore) Read(ctx context.Context, reqs []base.PageWant, fill func(int, uint64, uint64, []byte)) error {
	select {
	case <-s.armed:
		select {
		case s.entered <- struct{}{}:
			<-s.release
		default:
		}
	default:
	}
	return s.Store.Read(ctx, reqs, fill)
}

// TestCloseRacingMissIsErrClosed: a read that passed the DB's closed check and reaches the
// store after Close fails with an error matching ErrClosed on every store, so a game's worker
// loop that stops on ErrClosed stops at shutdown. Fails on 36b8b47: the embedded store's
// "storenode: engine closed" did not match ErrClosed (the remote store's error did).
func TestCloseRacingMissIsErrClosed(t *testing.T) {
	ctx := context.Background()
	stores := map[string]func(t *testing.T) (func() store.Store, func()){
		"embedded": func(t *testing.T) (func() store.Store, func()) {
			dir := t.TempDir()
			return func() store.Store { return newLocalStore(t, dir) }, func() {}
		},
		"remote": func(t *testing.T) (func() store.Store, func()) {
			addr, stop := startStorageNodeWith(t, storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone})
			return func() store.Store {
				s, err := dialStore(ctx, Options{StoreAddr: addr, OwnerID: 1000}.withDefaults())
				require.NoError(t, err)
				return s
			}, stop
		},
	}
	for name, mk := range stores {
		t.Run(name, func(t *testing.T) {
			open, stop := mk(t)
			defer stop()
			db := openDB(t, ctx, Options{Store: open(), OwnerID: 1000})
			items := newTable(t, ctx, db, "items", 64)
			id := insertRow(t, ctx, items, row(1))
			require.NoError(t, db.Close(ctx))

			gate := newGateStore(open())
			db = openDB(t, ctx, Options{Store: gate, OwnerID: 1000})
			items = openTable(t, ctx, db, "items")
			close(gate.armed)
			got := make(chan error, 1)
			go func() { got <- items.Get(ctx, id, make([]byte, 64)) }()
			select {
			case <-gate.entered:
			case <-time.After(30 * time.Second):
				t.Fatal("the miss never reached the store")
			}
			require.NoError(t, db.Close(ctx))
			close(gate.release)
			select {
			case err := <-got:
				require.ErrorIs(t, err, ErrClosed)
			case <-time.After(30 * time.Second):
				t.Fatal("Get did not return")
			}
		})
	}
}
