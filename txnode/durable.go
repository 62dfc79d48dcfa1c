package txnode

import (
	"context"
	"errors"
	"fmt"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/logicpage"
	"github.com/weftdb/weft/txnode/internal/coordbridge"
)

// durableTable is a read-only handle on a table this node does not own: each Get asks the
// store for the row (one round trip; nothing cached, no ownership taken, no lease kept). A
// storage node serves a reader that is not the table's holder only durable rows, so a row may
// be older than what the holder's cache (and its unflushed commits) has; the embedded store,
// which no other node can reach, serves what it has. Package cluster's node reads the
// partitions it does not own through it (docs/cluster.md). Handles are safe for concurrent
// use. txncoord.DurableTable is its API.
type durableTable coordbridge.Durable[DB]

// openDurable opens a table for durable reads only (durableTable), without taking its
// ownership: ErrTableNotFound when the store has no such table.
func (db *DB) openDurable(ctx context.Context, name string) (base.TableInfo, error) {
	if db.closed.Load() {
		return base.TableInfo{}, ErrClosed
	}
	return db.store.OpenTable(ctx, name)
}

// createDurableClusterTable creates a cluster-managed table holding partition
// layout.Partition of a partitioned table (name is its name at the store:
// base.PartitionTableName), like createClusterTable, but takes no ownership: the table is
// read through a durableTable. A name already in use is ErrTableExists (compare the existing
// one's Cluster and RowBytes to tell a retry from a clash).
func (db *DB) createDurableClusterTable(ctx context.Context, name string, rowBytes int, layout base.ClusterLayout) (base.TableInfo, error) {
	if db.closed.Load() {
		return base.TableInfo{}, ErrClosed
	}
	return db.store.CreateClusterTable(ctx, name, rowBytes, layout)
}

// get copies row id, as the store has it durably (see durableTable), into dst, whose length
// must be the row size. ErrNotFound when the store has no such row.
func (t *durableTable) get(ctx context.Context, id uint64, dst []byte) error {
	if len(dst) != t.Info.RowBytes {
		return fmt.Errorf("%w: buffer of %d bytes, table %q has %d-byte rows", ErrRowSize, len(dst), t.Info.Name, t.Info.RowBytes)
	}
	if t.DB.closed.Load() {
		return ErrClosed
	}
	page, slot := logicpage.PageOf(id)
	if page >= logicpage.TablePagesMax {
		return ErrNotFound // beyond any table's last page: no row there
	}
	bit := uint64(1) << slot
	found := false
	req := [1]base.PageWant{{Table: t.Info.ID, Page: page, Want: bit}}
	err := t.DB.store.Read(ctx, req[:], func(_ int, data, _ uint64, rows []byte) {
		if data&bit != 0 && len(rows) >= len(dst) {
			copy(dst, rows[:len(dst)])
			found = true
		}
	})
	if err != nil {
		return err
	}
	if !found {
		return ErrNotFound
	}
	return nil
}

// servingErr returns nil while this node may serve the table (its lease, or for a
// cluster-managed table its etcd grant, holds), else the error the table's reads and writes
// fail with (ErrLeaseExpired wrapping the grant's error, and ErrFenced once the
// store fenced the grant; ErrTableNotFound once dropped). One clock read or grant check; no
// allocation on success.
func (t *Table) servingErr() error {
	err := t.t.serving()
	if err != nil && t.t.storeFenced.Load() && !t.t.storeGone.Load() && !errors.Is(err, ErrFenced) {
		return fmt.Errorf("%w (%w)", err, ErrFenced)
	}
	return err
}
