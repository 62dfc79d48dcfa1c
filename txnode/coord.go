package txnode

import (
	"context"
	"iter"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/txnode/internal/coordbridge"
	"github.com/weftdb/weft/txnode/store"
)

// The cluster coordinator's surface (package txnode/txncoord), handed over unexported so that
// txnode's own API is what a game uses. Each field calls one unexported function or method;
// the handles' state (coordbridge.Part, Turn, Durable) is txncoord's, worked on in place.
func init() {
	coordbridge.Set(&coordbridge.Funcs[DB, Table, Tx, Row, Options]{
		Open: openWithGrants,

		DecideTxn: (*DB).decideTxn,
		ApplyTxn:  (*DB).applyTxn,
		CreateClusterTable: func(db *DB, ctx context.Context, table string, rowBytes int, layout base.ClusterLayout) (*Table, error) {
			return db.createClusterTable(ctx, table, rowBytes, layout)
		},
		OpenDurable:               (*DB).openDurable,
		CreateDurableClusterTable: (*DB).createDurableClusterTable,

		DurableGet: func(d *coordbridge.Durable[DB], ctx context.Context, id uint64, dst []byte) error {
			return (*durableTable)(d).get(ctx, id, dst)
		},
		DurableScan: func(d *coordbridge.Durable[DB], ctx context.Context, lo, hi uint64) iter.Seq2[Row, error] {
			return (*durableTable)(d).scan(ctx, lo, hi)
		},

		PrepareLock: (*Tx).prepareLock,
		PrepareSend: func(tx *Tx, ts store.TxnStore, info coordbridge.TxnInfo, p *coordbridge.Part[Tx]) (bool, error) {
			return tx.prepareSend(ts, info, (*prepared)(p))
		},
		Validate:  (*Tx).validateLive,
		WaitReads: (*Tx).waitReads,
		CacheBusy: (*Tx).cacheBusy,

		PartValidate: func(p *coordbridge.Part[Tx]) error { return (*prepared)(p).validate() },
		PartApply: func(p *coordbridge.Part[Tx], ctx context.Context, d base.Decision) error {
			return (*prepared)(p).apply(ctx, d)
		},
		PartApplyUncertain: func(p *coordbridge.Part[Tx], ctx context.Context) (base.Decision, error) {
			return (*prepared)(p).applyUncertain(ctx)
		},
		PartAbandon: func(p *coordbridge.Part[Tx]) { (*prepared)(p).abandon() },

		TurnWait:    func(c *coordbridge.Turn[DB], tx *Tx) error { return (*cacheTurn)(c).wait(tx) },
		TurnHold:    func(c *coordbridge.Turn[DB], tx *Tx) { (*cacheTurn)(c).hold(tx) },
		TurnRelease: func(c *coordbridge.Turn[DB]) { (*cacheTurn)(c).releaseLoop() },

		Serving:      (*Table).servingErr,
		HoldWrites:   (*Table).holdWrites,
		ResumeWrites: (*Table).resumeWrites,
		WritesHeld:   (*Table).writesHeld,
		FlushHeld:    (*Table).flushHeld,
		Opened:       (*DB).opened,
		Supersede:    (*Table).supersede,
		Same:         func(a, b *Table) bool { return a != nil && b != nil && a.t == b.t },
		Serial:       func(t *Table) uint64 { return t.t.serial },

		Forget:  (*Table).forget,
		TableID: func(t *Table) uint32 { return t.t.id },
		TableDB: func(t *Table) *DB { return t.db },

		CacheBytes: cacheBytes,
	})
}
