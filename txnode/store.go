package txnode

import (
	"context"
	"time"
)

// Store is the durable side of a transaction node: a storage node over TCP (the remote store)
// or an in-process storage engine (the embedded default). It is defined here, by its consumer.
// Every method may be called from any goroutine. Errors map to the storage node's sentinels
// (errors.Is works across TCP).
type Store interface {
	// Info reports the store's sync mode and limits (the hello reply, for a remote store).
	Info() StoreInfo

	CreateTable(ctx context.Context, name string, rowBytes int) (StoreTable, error)
	OpenTable(ctx context.Context, name string) (StoreTable, error)
	ListTables(ctx context.Context) ([]StoreTable, error)
	DropTable(ctx context.Context, name string) error

	// Acquire asks for (epoch 0) or renews (epoch != 0) the write ownership of a table.
	Acquire(ctx context.Context, table uint32, owner, epoch uint64) (StoreGrant, error)
	// AllocIDs grants whole pages of new row ids; the grant is durable when it returns.
	AllocIDs(ctx context.Context, table uint32, owner, epoch uint64, pages int) (first, count uint64, err error)

	// Read answers sparse reads: for each request, fill is called (on some goroutine, one
	// call at a time per Read) with the request's index, the present rows of its want mask
	// (data), its absent ones (clear) and the rows of data in slot order. rows is valid only
	// during the call.
	Read(ctx context.Context, reqs []ReadRequest, fill func(i int, data, clear uint64, rows []byte)) error
	// PageDir lists the pages of [lo, hi) holding rows, at most max, appending to dst; next is
	// where to continue (hi when done).
	PageDir(ctx context.Context, table uint32, lo, hi uint64, max int, dst []PageInfo) ([]PageInfo, uint64, error)

	// Commit sends a batch and calls done once with its LSN when the store acknowledged it,
	// or with an error. The batch and its rows must not change until done is called. done
	// may run on any goroutine, must be quick and must not call back into the store's
	// blocking methods.
	Commit(b *CommitBatch, done func(lsn uint64, err error))

	// Ping is traffic and nothing else: a node that holds no table still keeps its owner id
	// live at a storage node with it (another incarnation may take an id silent for a lease).
	// The embedded store has nobody to tell and returns nil.
	Ping(ctx context.Context) error

	// Close releases the store (the embedded one checkpoints and closes its engine).
	Close() error
}

// StoreInfo is what a store reports about itself.
type StoreInfo struct {
	// SyncMode is "always" or "none".
	SyncMode string
	// Lease is how long an ownership grant lives without renewal; 0 means it never expires
	// (the embedded store, which no other node can reach).
	Lease time.Duration
	// MaxBatchBytes bounds one commit batch's encoded size.
	MaxBatchBytes int
}

// StoreTable describes a table as the store knows it.
type StoreTable struct {
	ID       uint32
	Name     string
	RowBytes int
	NextID   uint64
}

// StoreGrant is a table's write ownership.
type StoreGrant struct {
	Table   uint32
	Epoch   uint64
	Lease   time.Duration
	LastSeq uint64
}

// ReadRequest asks for the rows of want in one page.
type ReadRequest struct {
	Table uint32
	Page  uint64
	Want  uint64
}

// PageInfo is a page holding rows, with its present mask.
type PageInfo struct {
	Page    uint64
	Present uint64
}

// CommitBatch is one commit batch: the segments of one or more transactions of this node,
// atomic as a whole. Rows of segment i are Rows[i], popcount(Data)*rowBytes bytes.
type CommitBatch struct {
	Owner    uint64
	Seq      uint64
	Fences   []BatchFence
	Segments []BatchSegment
}

// BatchFence names a table the batch writes and the epoch this node holds for it.
type BatchFence struct {
	Table uint32
	Epoch uint64
}

// BatchSegment is one page's changes: rows of Data (in slot order, in Rows) and slots of Clear
// deleted.
type BatchSegment struct {
	Table    uint32
	RowBytes int
	Page     uint64
	Data     uint64
	Clear    uint64
	Rows     []byte
}
