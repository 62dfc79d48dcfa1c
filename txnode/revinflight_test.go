package txnode

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Regression tests of the in-flight review (rows in flight evictable, Options.InflightBytes).

// TestWriteBackCloseHonoursCtxAtInflightBound: WriteBack, acknowledgements held, one epoch in
// flight fills Options.InflightBytes. Close with an ended context must return its error (the
// commits not acknowledged then fail with ErrUnknownOutcome), not block: on 1b60889 its final
// cut waited for room in flight with no context (flushEpoch's p.room.Wait), for ever.
// DropTable's flush likewise.
func TestWriteBackCloseHonoursCtxAtInflightBound(t *testing.T) {
	for _, op := range []string{"close", "droptable"} {
		t.Run(op, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			fs := newFlightStore(t, newLocalStore(t, ""))
			db, err := Open(ctx, Options{Store: fs, Durability: WriteBack, FlushInterval: time.Hour,
				InflightBytes: 64 + segFlightBytes})
			require.NoError(t, err)
			tb, err := db.CreateTable(ctx, "t", 64)
			require.NoError(t, err)
			ids := insertRows(t, db, tb, 128)
			require.NoError(t, db.pipe.flush(ctx))
			fs.hold()
			require.NoError(t, tb.Put(ctx, ids[0], u64Row(64, 1)))
			db.pipe.flushEpoch() // in flight, held: the bound is full
			require.NoError(t, tb.Put(ctx, ids[64], u64Row(64, 2)))

			ended, endNow := context.WithCancel(ctx)
			endNow()
			errs := make(chan error, 1)
			if op == "close" {
				go func() { errs <- db.Close(ended) }()
				require.ErrorIs(t, recvWithin(t, errs, "Close with an ended context"), context.Canceled)
				return
			}
			go func() { errs <- db.DropTable(ended, "t") }()
			require.ErrorIs(t, recvWithin(t, errs, "DropTable with an ended context"), context.Canceled)
			fs.openAll()
			require.NoError(t, db.Close(ctx))
		})
	}
}
