package txnode

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// DB.Flush makes every commit of the DB durable, whichever session or call made it: in
// WriteBack mode at once, not at the next flush period (an hour here, so nothing else flushes).
func TestDBFlushMakesEveryCommitDurable(t *testing.T) {
	ctx := context.Background()
	for name, d := range map[string]Durability{"writeback": WriteBack, "durable": Durable} {
		t.Run(name, func(t *testing.T) {
			db := openDB(t, ctx, Options{Dir: t.TempDir(), SyncMode: "none", Durability: d, FlushInterval: time.Hour})
			defer db.Close(ctx)
			tb := newTable(t, ctx, db, "items", 64)
			for v := range uint64(50) {
				insertRow(t, ctx, tb, u64Row(64, v))
			}
			s := db.Session()
			for v := range uint64(10) {
				s.Go(ctx, func(tx *Tx) error { _, err := tx.Insert(tb, u64Row(64, 100+v)); return err })
			}
			if d == WriteBack {
				st := db.Stats()
				require.Less(t, st.DurableVersion, st.CommitVersion, "nothing flushed yet")
			}
			require.NoError(t, db.Flush(ctx))
			st := db.Stats()
			require.GreaterOrEqual(t, st.DurableVersion, st.CommitVersion)
		})
	}
}
