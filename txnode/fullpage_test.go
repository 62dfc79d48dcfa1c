package txnode

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/storenode"
)

// TestFullPageIOAblation checks that the ablation ships whole pages and stays correct, and
// shows on the wire what sparse IO saves on random single-row updates.
func TestFullPageIOAblation(t *testing.T) {
	ctx := context.Background()
	var upBytes [2]int64
	for i, full := range []bool{false, true} {
		addr, _ := startStorageNodeWith(t, storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone, LeaseDuration: time.Hour})
		proxy := startCountingProxy(t, addr)
		db := openDB(t, ctx, Options{StoreAddr: proxy.ln.Addr().String(), OwnerID: 9, FullPageIO: full})
		items := newTable(t, ctx, db, "items", 64)
		for i := range 64 * 16 {
			insertRow(t, ctx, items, row(uint64(i)))
		}
		up0, _ := proxy.snapshot()
		for k := range 100 {
			id := uint64(k*37) % (64 * 16)
			require.NoError(t, items.Put(ctx, id, row(id+1)))
		}
		up1, _ := proxy.snapshot()
		upBytes[i] = up1 - up0
		buf := make([]byte, 64)
		for k := range 100 {
			id := uint64(k*37) % (64 * 16)
			require.NoError(t, items.Get(ctx, id, buf))
			require.Equal(t, row(id+1), buf)
		}
		require.NoError(t, db.Close(ctx))
	}
	t.Logf("100 random single-row updates: %d bytes sparse, %d bytes full-page (%.1fx)",
		upBytes[0], upBytes[1], float64(upBytes[1])/float64(upBytes[0]))
	require.Greater(t, upBytes[1], 10*upBytes[0])
}
