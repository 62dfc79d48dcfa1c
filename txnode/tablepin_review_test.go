package txnode

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestTablePinEndedWhileFetchingLastPage: an Unpin or a DropTable while a Pin fetches the
// table's last page ends that Pin: it fails (Unpin's contract: a Pin in flight fails), and
// nothing is left pinned. The Pin used to return nil with no pin held.
func TestTablePinEndedWhileFetchingLastPage(t *testing.T) {
	for _, drop := range []bool{false, true} {
		name := "unpin"
		if drop {
			name = "drop"
		}
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			dir := t.TempDir()
			db, err := Open(ctx, Options{Dir: dir, SyncMode: "none"})
			require.NoError(t, err)
			tb, err := db.CreateTable(ctx, "t", 64)
			require.NoError(t, err)
			fillTable(t, ctx, db, tb, 1, 0) // one page: the Pin's last
			require.NoError(t, db.Close(ctx))

			held := newHeldReadStore(newLocalStore(t, dir))
			db, err = Open(ctx, Options{Store: held})
			require.NoError(t, err)
			defer db.Close(ctx)
			tb, err = db.Table(ctx, "t")
			require.NoError(t, err)

			held.armed.Store(true)
			res := make(chan error, 1)
			go func() { res <- tb.Pin(ctx) }()
			recvWithin(t, held.entered, "the Pin's fetch")
			if drop {
				require.NoError(t, db.DropTable(ctx, "t"))
			} else {
				tb.Unpin()
			}
			close(held.release)
			err = recvWithin(t, res, "the Pin")
			require.Error(t, err, "a Pin ended while in flight")
			if drop {
				require.ErrorIs(t, err, ErrTableNotFound)
			}
			require.False(t, tb.Stats().Pinned)
			require.Zero(t, db.Stats().PinnedBytes)
			require.NoError(t, db.cache.verify())
		})
	}
}
