package txnode

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/storenode"
)

// TestLeaseOfReadTableCheckedAtWriteCommit: a read-write transaction that read table a and
// writes only table b checks a's lease at commit too. Its reads of a are served from the
// cache once a was first touched; if a's lease ran out meanwhile another node may own a and
// have changed the rows read, and validation (local version words) cannot see that. On main
// c783a6d only the written tables' leases were checked at commit: the transfer committed.
func TestLeaseOfReadTableCheckedAtWriteCommit(t *testing.T) {
	ctx := context.Background()
	addr, _ := startStorageNodeWith(t, storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone, LeaseDuration: time.Hour})
	clock := &fakeLeaseClock{}
	clock.n.Store(int64(1000 * time.Hour))
	db, err := Open(ctx, Options{StoreAddr: addr, OwnerID: 79, clock: clock})
	require.NoError(t, err)
	defer db.Close(ctx)
	a, err := db.CreateTable(ctx, "a", 64)
	require.NoError(t, err)
	aids := insertRows(t, db, a, 2)
	clock.n.Add(int64(30 * time.Minute)) // a's lease (45 usable minutes) has 15 left
	b, err := db.CreateTable(ctx, "b", 64)
	require.NoError(t, err) // b's lease is live for 45 minutes from now
	bids := insertRows(t, db, b, 1)
	buf := make([]byte, 64)

	tx, err := db.Begin(ctx, true)
	require.NoError(t, err)
	defer tx.Rollback()
	require.NoError(t, tx.Get(a, aids[0], buf))
	clock.n.Add(int64(20 * time.Minute)) // a's lease ran out; b's has 25 minutes left
	require.NoError(t, tx.Get(a, aids[1], buf), "checked at the first touch of the table")
	require.NoError(t, tx.Put(b, bids[0], buf))
	require.ErrorIs(t, tx.Commit(), ErrLeaseExpired)
}
