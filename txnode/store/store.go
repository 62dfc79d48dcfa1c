package store

import (
	"context"
	"time"

	"github.com/weftdb/weft/base"
)

// Store is the durable side of a transaction node: a storage node over TCP (txnode's remote
// store) or an in-process storage engine (OpenEmbedded). See the package doc for which
// goroutine calls each method, how long buffers stay valid and which errors each returns.
type Store interface {
	// Info reports the store's sync mode and limits (the hello reply, for a remote store).
	Info() Info

	// CreateTable creates a table of rowBytes-byte rows.
	CreateTable(ctx context.Context, name string, rowBytes int) (base.TableInfo, error)
	// CreateClusterTable creates a cluster-managed table of rowBytes-byte rows holding
	// partition layout.Partition (docs/cluster.md); name is base.PartitionTableName's.
	CreateClusterTable(ctx context.Context, name string, rowBytes int, layout base.ClusterLayout) (base.TableInfo, error)
	// OpenTable looks a table up by name.
	OpenTable(ctx context.Context, name string) (base.TableInfo, error)
	// ListTables lists every table, in no particular order.
	ListTables(ctx context.Context) ([]base.TableInfo, error)
	// DropTable deletes a table and its rows on behalf of owner (the caller's owner id): the
	// table's holder, or anyone when no other owner's lease is live. A remote store drops on
	// behalf of its connection's owner id, which is owner.
	DropTable(ctx context.Context, name string, owner uint64) error

	// Acquire asks for (epoch 0) or renews (epoch != 0) the write ownership of a table. With
	// AcquireEtcdGrant in flags it registers the etcd grant of revision epoch of a
	// cluster-managed table instead (the store verifies it in etcd: it may take a round trip
	// to etcd); a current grant registered again is a renewal.
	Acquire(ctx context.Context, table uint32, owner, epoch uint64, flags AcquireFlags) (base.Grant, error)
	// AllocIDs grants whole pages of new row ids; the grant is durable when it returns.
	AllocIDs(ctx context.Context, table uint32, owner, epoch uint64, pages int) (first, count uint64, err error)

	// Read answers sparse reads: for each request, fill is called (on some goroutine, one
	// call at a time per Read) with the request's index, the present rows of its want mask
	// (data), its absent ones (clear) and the rows of data in slot order. rows is valid only
	// during the call. fill is never called after Read returns (a reply that arrives after
	// its Read gave up is dropped), and Read keeps neither reqs nor fill: the caller may
	// reuse both once it returns.
	Read(ctx context.Context, reqs []base.PageWant, fill func(i int, data, clear uint64, rows []byte)) error
	// PageDir lists the pages of [lo, hi) holding rows, at most max, appending to dst; next is
	// where to continue (hi when done).
	PageDir(ctx context.Context, table uint32, lo, hi uint64, max int, dst []PageInfo) ([]PageInfo, uint64, error)

	// Commit sends a batch and calls done once with its LSN when the store acknowledged it,
	// or with an error. The batch and its rows must not change until done is called. done
	// may run on any goroutine, must be quick and must not call back into the store's
	// blocking methods.
	Commit(b *base.Batch, done func(lsn uint64, err error))

	// Ping is traffic and nothing else: a node that holds no table still keeps its owner id
	// live at a storage node with it (another incarnation may take an id silent for a lease).
	// The embedded store has nobody to tell and returns nil (storenode.ErrClosed after Close).
	Ping(ctx context.Context) error

	// Close releases the store (the embedded one checkpoints and closes its engine).
	Close() error
}

// Info is what a store reports about itself.
type Info struct {
	// SyncMode is "always" or "none".
	SyncMode string
	// Lease is how long an ownership grant lives without renewal; 0 means it never expires
	// (the embedded store, which no other node can reach).
	Lease time.Duration
	// MaxBatchBytes bounds one commit batch's encoded size.
	MaxBatchBytes int
}

// AcquireFlags modify an Acquire.
type AcquireFlags uint32

// AcquireEtcdGrant: the epoch is an etcd grant's revision of a cluster-managed table
// (sgio.AcquireEtcdGrant).
const AcquireEtcdGrant AcquireFlags = 1

// PageInfo is a page holding rows, with its present mask.
type PageInfo struct {
	Page    uint64
	Present uint64
}
