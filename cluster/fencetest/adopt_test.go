package fencetest

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/txnode"
	"github.com/weftdb/weft/txnode/store"
	"github.com/weftdb/weft/txnode/txncoord"
)

// pausedVerifier is the real GrantVerifier, each verification held until the test lets it
// go: entered gets one value per verification waiting.
type pausedVerifier struct {
	*cluster.GrantVerifier
	entered chan struct{}
	gate    chan struct{}
}

func (v *pausedVerifier) VerifyGrant(ctx context.Context, table string, p uint32, owner, epoch uint64) error {
	v.entered <- struct{}{}
	select {
	case <-v.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	return v.GrantVerifier.VerifyGrant(ctx, table, p, owner, epoch)
}

// hookStore is a store calling afterOpen, when set, after each OpenTable.
type hookStore struct {
	store.Store
	afterOpen atomic.Pointer[context.CancelFunc]
}

func (s *hookStore) OpenTable(ctx context.Context, name string) (base.TableInfo, error) {
	t, err := s.Store.OpenTable(ctx, name)
	if f := s.afterOpen.Load(); f != nil {
		(*f)()
	}
	return t, err
}

// Two opens of the same cluster-managed table race in a transaction node: the second finds
// the table not yet open, takes the partition's grant (the session hands it the very
// Ownership the first holds) and its registration fails (its context ends while etcd is
// slow to answer: here it ends just after the second open found the table in the store). Its failure
// must not release the grant the first open is registering and then serves under: the table
// the first open returns serves, and the owner key stays in etcd.
func TestConcurrentOpenKeepsGrant(t *testing.T) {
	ctx := testCtx(t)
	_, c := acctCluster(t, ctx, 1)
	v := &pausedVerifier{GrantVerifier: cluster.NewGrantVerifier(c, storenode.ErrFenced),
		entered: make(chan struct{}, 4), gate: make(chan struct{})}
	es, err := store.OpenEmbedded(storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone, GrantVerifier: v})
	require.NoError(t, err)
	hs := &hookStore{Store: es}
	st := store.Store(hs)
	name := base.PartitionTableName("acct", 0)
	_, err = st.CreateClusterTable(ctx, name, 64, base.ClusterLayout{Partitions: 1, StripePages: 1})
	require.NoError(t, err)
	const owner = 0x51
	s := newSession(t, c, owner, 0)
	db, err := txncoord.Open(ctx, txnode.Options{Store: st, OwnerID: owner,
		Logger: slog.New(slog.DiscardHandler)}, &cluster.TxGrants{Session: s})
	require.NoError(t, err)
	defer db.Close(ctx)

	type opened struct {
		tb  *txnode.Table
		err error
	}
	first := make(chan opened, 1)
	go func() {
		tb, err := db.Table(ctx, name)
		first <- opened{tb, err}
	}()
	<-v.entered // the first open holds the grant; its registration waits for etcd's answer

	// The second open's context ends right after it looked the table up in the store: it
	// is past the transaction node's check for an open table, and its registration (if it
	// gets that far) fails.
	sctx, cancel := context.WithCancel(ctx)
	hs.afterOpen.Store(&cancel)
	_, err = db.Table(sctx, name)
	require.ErrorIs(t, err, context.Canceled, "the second open's context ended")

	close(v.gate)
	r := <-first
	require.NoError(t, r.err)
	_, err = r.tb.Insert(ctx, row(1))
	require.NoError(t, err, "the first open's table serves under its grant")
	h, ok, err := c.Owner(ctx, "acct", 0)
	require.NoError(t, err)
	require.True(t, ok, "the owner key is still there")
	require.EqualValues(t, owner, h.Owner)
}
