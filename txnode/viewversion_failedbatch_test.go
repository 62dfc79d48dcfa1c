package txnode

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/internal/testkit/faultstore"
)

// TestViewVersionAfterFailedBatchApplied: a row's version identifies its bytes
// (Table.ViewVersion) also when a batch failed at the node but reached the store. The
// failed batch's rows are invalidated and fetched again; the fetch must not stamp them with
// a version the row already had with its older bytes (the durable version, which the failed
// batch did not advance). Under Durable a read may refuse with the failure instead.
func TestViewVersionAfterFailedBatchApplied(t *testing.T) {
	for name, mode := range map[string]Durability{"Durable": Durable, "WriteBack": WriteBack} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			ls := &faultstore.LostAck{Store: newLocalStore(t, "")}
			db := openDB(t, ctx, Options{Store: ls, Durability: mode})
			t.Cleanup(func() { db.Close(ctx) })
			tb := newTable(t, ctx, db, "v", 64)
			id := insertRow(t, ctx, tb, u64Row(64, 1))
			require.NoError(t, db.pipe.flush(ctx))

			var got, ver uint64
			keep := func(row []byte, v uint64) error { got, ver = checkRow(t, row), v; return nil }
			require.NoError(t, tb.ViewVersion(ctx, id, keep))
			require.Equal(t, uint64(1), got)
			v1 := ver

			ls.Armed.Store(true)
			err := tb.Put(ctx, id, u64Row(64, 2))
			if mode == WriteBack {
				require.NoError(t, err)
				err = db.pipe.flush(ctx)
			}
			require.ErrorIs(t, err, faultstore.ErrAckLost)

			err = tb.ViewVersion(ctx, id, keep)
			if mode == Durable && err != nil {
				require.ErrorIs(t, err, faultstore.ErrAckLost)
				return
			}
			require.NoError(t, err)
			require.Equal(t, uint64(2), got, "the store holds the batch")
			require.NotEqual(t, v1, ver, "row %d: version %d showed value 1, now value 2", id, v1)
		})
	}
}
