package txnode

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// A connection that lost this node's owner id at the storage node (released here, through
// the node's own connection, which stays open; a reconnect replacing it is the same case) is
// a connection problem, not a fence: the re-registration of a cluster table's grant that gets
// the storage node's refusal reconnects, registers again, and the table keeps serving and
// committing; a commit batch refused so is sent again on the new connection. Fails on
// 964dade: the refusal was ErrFenced, which latched the table for good although its grant
// was current (and failed the commit and the pipeline).
func TestIdentityLostDoesNotLatchClusterTable(t *testing.T) {
	for _, first := range []string{"re-registration", "commit"} {
		t.Run(first, func(t *testing.T) { testIdentityLost(t, first) })
	}
}

func testIdentityLost(t *testing.T, first string) {
	ctx := context.Background()
	const owner = 0x42
	g := &memGrants{keys: map[string][2]uint64{}, owner: owner, rev: 10}
	addr, _ := startStorageNodeWith(t, storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone, GrantVerifier: g})
	db, tick, renewed := openRenewing(t, ctx, Options{StoreAddr: addr, OwnerID: owner, grants: g})
	defer db.Close(ctx)
	tb, _ := acctTable(t, ctx, db)
	id := insertRow(t, ctx, tb, row(1))

	// The owner id released on the node's current connection, behind the DB's back.
	rs := db.store.(*remoteStore)
	rs.mu.Lock()
	c := rs.conn
	rs.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	require.NoError(t, c.CallInto(cctx, &sgio.Release{Owner: owner}, &sgio.OK{}))

	dst := make([]byte, 64)
	if first == "commit" {
		// The batch refused on the old connection is sent again on a new one.
		require.NoError(t, tb.Put(ctx, id, row(3)), "the commit reconnected and was sent again")
		require.NoError(t, tb.servingErr(), "a lost identity latches nothing")
		require.NoError(t, tb.Get(ctx, id, dst))
		require.Equal(t, row(3), dst)
	}
	select {
	case tick <- time.Time{}:
	case <-cctx.Done():
		t.Fatal("no renewal loop took the tick")
	}
	var err error
	select {
	case err = <-renewed:
	case <-cctx.Done():
		t.Fatal("no re-registration ended")
	}
	require.NoError(t, err, "the re-registration reconnected and registered again")
	require.NoError(t, tb.servingErr(), "a lost identity latches nothing")
	require.NoError(t, tb.Get(ctx, id, dst))
	require.NoError(t, tb.Put(ctx, id, row(2)), "and the table commits on the new connection")
	require.NoError(t, tb.Get(ctx, id, dst))
	require.Equal(t, row(2), dst)
}
