package txncoord_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/txnode"
	"github.com/weftdb/weft/txnode/txncoord"
)

// Forget, TableID and TableDB reach txnode through the bridge: a forgotten handle fails with
// ErrForgotten (and ErrLeaseExpired), its rows stay at the store, and the next open is a new
// state with the same table id; CacheBytes is Open's budget (its default for 0, its least
// below it).
func TestForgetTableIDAndCacheBytes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, tb := open(t, ctx)
	require.Same(t, db, txncoord.TableDB(tb))
	tables, err := db.Tables(ctx)
	require.NoError(t, err)
	require.Len(t, tables, 1)
	require.Equal(t, tables[0].ID, txncoord.TableID(tb))
	id, err := tb.Insert(ctx, row(3))
	require.NoError(t, err)

	require.NoError(t, txncoord.Forget(ctx, tb))
	dst := make([]byte, 64)
	err = tb.Get(ctx, id, dst)
	require.ErrorIs(t, err, txnode.ErrForgotten)
	require.ErrorIs(t, err, txnode.ErrLeaseExpired)
	require.NoError(t, txncoord.Forget(ctx, tb), "forgetting a forgotten state is a no-op")

	again, err := db.Table(ctx, "t")
	require.NoError(t, err)
	require.Equal(t, tables[0].ID, txncoord.TableID(again))
	require.NoError(t, again.Get(ctx, id, dst))
	require.Equal(t, row(3), dst)

	require.Equal(t, int64(64<<20), txncoord.CacheBytes(0))
	require.Equal(t, int64(64<<10), txncoord.CacheBytes(1))
	require.Equal(t, int64(1<<30), txncoord.CacheBytes(1<<30))

	require.NoError(t, db.Close(ctx))
	require.ErrorIs(t, txncoord.Forget(ctx, again), txnode.ErrClosed)
}
