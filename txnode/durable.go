package txnode

import (
	"context"
	"errors"
	"fmt"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/logicpage"
)

// DurableTable is a read-only handle on a table this node does not own: each Get asks the
// store for the row (one round trip; nothing cached, no ownership taken, no lease kept). A
// storage node serves a reader that is not the table's holder only durable rows, so a row may
// be older than what the holder's cache (and its unflushed commits) has; the embedded store,
// which no other node can reach, serves what it has. Package cluster's node reads the
// partitions it does not own through it (docs/cluster.md). Handles are safe for concurrent
// use.
type DurableTable struct {
	db *DB
	st base.TableInfo
}

// OpenDurable opens a table for durable reads only (DurableTable), without taking its
// ownership: ErrTableNotFound when the store has no such table.
func (db *DB) OpenDurable(ctx context.Context, name string) (*DurableTable, error) {
	if db.closed.Load() {
		return nil, ErrClosed
	}
	st, err := db.store.OpenTable(ctx, name)
	if err != nil {
		return nil, err
	}
	return &DurableTable{db: db, st: st}, nil
}

// CreateDurableClusterTable creates a cluster-managed table holding partition layout.Partition
// of the partitioned table table (its name at the store: base.PartitionTableName), like
// CreateClusterTable, but takes no ownership: it returns a DurableTable. A name already in use
// is ErrTableExists (compare the existing one's Cluster and RowBytes to tell a retry from a
// clash).
func (db *DB) CreateDurableClusterTable(ctx context.Context, name string, rowBytes int, layout ClusterLayout) (*DurableTable, error) {
	if db.closed.Load() {
		return nil, ErrClosed
	}
	st, err := db.store.CreateClusterTable(ctx, name, rowBytes, layout)
	if err != nil {
		return nil, err
	}
	return &DurableTable{db: db, st: st}, nil
}

// Name returns the table's name at the store.
func (t *DurableTable) Name() string { return t.st.Name }

// RowBytes returns the table's row size.
func (t *DurableTable) RowBytes() int { return t.st.RowBytes }

// ID returns the table's id in the store, as it was when the handle was opened (a table
// dropped and created again there has a new one).
func (t *DurableTable) ID() uint32 { return t.st.ID }

// Cluster returns a cluster-managed table's layout and partition (Partitions 0: a local table).
func (t *DurableTable) Cluster() ClusterLayout { return t.st.Cluster }

// Get copies row id, as the store has it durably (see DurableTable), into dst, whose length
// must be the row size. ErrNotFound when the store has no such row.
func (t *DurableTable) Get(ctx context.Context, id uint64, dst []byte) error {
	if len(dst) != t.st.RowBytes {
		return fmt.Errorf("%w: buffer of %d bytes, table %q has %d-byte rows", ErrRowSize, len(dst), t.st.Name, t.st.RowBytes)
	}
	if t.db.closed.Load() {
		return ErrClosed
	}
	page, slot := logicpage.PageOf(id)
	if page >= logicpage.TablePagesMax {
		return ErrNotFound // beyond any table's last page: no row there
	}
	bit := uint64(1) << slot
	found := false
	req := [1]base.PageWant{{Table: t.st.ID, Page: page, Want: bit}}
	err := t.db.store.Read(ctx, req[:], func(_ int, data, _ uint64, rows []byte) {
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

// Serving returns nil while this node may serve the table (its lease, or for a
// cluster-managed table its etcd grant, holds), else the error the table's reads and writes
// fail with (ErrLeaseExpired wrapping the grant's error, and ErrFenced once the
// store fenced the grant; ErrTableNotFound once dropped). One clock read or grant check; no
// allocation on success.
func (t *Table) Serving() error {
	err := t.t.serving()
	if err != nil && t.t.storeFenced.Load() && !t.t.storeGone.Load() && !errors.Is(err, ErrFenced) {
		return fmt.Errorf("%w (%w)", err, ErrFenced)
	}
	return err
}
