// Package txncoord is the cluster coordinator's view of a transaction node (package
// cluster/node): what it asks of a txnode.DB beyond what a game uses. A game server needs
// nothing from this package. Rules:
//   - two-phase commit's participant: Prepare a part (its rows stay locked in the node's
//     cache), DecideTxn at the primary, then Prepared.Apply the decision to every part
//     (docs/cluster.md, "Two-phase commit"; the invariants are in txnode/prepare.go);
//   - a coordinator's own retry loop over Begin/Commit holds the cache turn as DB.Update's
//     does (CacheBusy, CacheTurn);
//   - partitions this node does not own are read durably, without ownership (DurableTable);
//   - a partition move holds an owner's writes before it freezes the source (HoldWrites,
//     FlushHeld) and checks that a table is still served (Serving).
//
// Every function is a typed call of txnode's unexported implementation
// (txnode/internal/coordbridge); behaviour, errors and allocations are txnode's.
package txncoord

import (
	"context"
	"iter"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/txnode"
	"github.com/weftdb/weft/txnode/internal/coordbridge"
)

var fn = coordbridge.Get[txnode.DB, txnode.Table, txnode.Tx, txnode.Row, txnode.Options]()

// ErrNoTxnStore is returned by Prepare, DecideTxn and ApplyTxn over a store that does not do
// two-phase commit (store.TxnStore).
var ErrNoTxnStore = coordbridge.ErrNoTxnStore

// Decision is a two-phase commit's outcome.
type Decision = base.Decision

// Decisions.
const (
	DecisionNone   = base.DecisionNone // undecided (an answer only)
	DecisionCommit = base.DecisionCommit
	DecisionAbort  = base.DecisionAbort
)

// ClusterLayout is a cluster-managed table's layout (cluster.Layout) and the partition a
// table holds.
type ClusterLayout = base.ClusterLayout

// Grants hands out the etcd grants of the partitions of cluster-managed tables (docs/cluster.md).
// Package cluster implements it on a Session (cluster.TxGrants); txnode does not import
// cluster, so a node without a cluster links no etcd. Any goroutine may call it.
type Grants = coordbridge.Grants

// Open opens a cluster's transaction node as txnode.Open does, its cluster-managed tables
// served under g's grants: a table the store reports as cluster-managed is served only under
// a grant from g (a node from txnode.Open fails to open one). g must not be nil.
func Open(ctx context.Context, opts txnode.Options, g Grants) (*txnode.DB, error) {
	return fn.Open(ctx, opts, g)
}

// CreateClusterTable creates a cluster-managed table holding partition layout.Partition of
// the partitioned table table (its name at the store: base.PartitionTableName) and takes its
// write ownership through the grants of Open.
func CreateClusterTable(ctx context.Context, db *txnode.DB, table string, rowBytes int, layout ClusterLayout) (*txnode.Table, error) {
	return fn.CreateClusterTable(db, ctx, table, rowBytes, layout)
}

// DecideTxn records decision d of transaction id, of count participants, at db's storage
// node (the transaction's primary): a compare-and-set. It returns nil when d is the recorded
// decision; an error matching txnode.ErrTxnDecided when the other one is (a commit asked
// after a resolver recorded abort: the transaction aborted); any other error leaves the
// decision unknown (send the same decision again: never another one). Any goroutine may call
// it.
func DecideTxn(ctx context.Context, db *txnode.DB, id base.TxnID, lease int64, d Decision, count int) error {
	return fn.DecideTxn(db, ctx, id, lease, d, count)
}

// ApplyTxn sends decision d of transaction id to db's storage node without a Prepared: a
// coordinator aborts with it a part whose prepare it never learned the outcome of (it may
// land later: the storage node then refuses it). Idempotent.
func ApplyTxn(ctx context.Context, db *txnode.DB, id base.TxnID, d Decision) error {
	return fn.ApplyTxn(db, ctx, id, d)
}

// Validate checks that everything tx read is unchanged and its tables still served, without
// ending it: txnode.ErrConflict, or the lease or grant error. A coordinator calls it on a
// part whose closure failed, to tell a conflict (retry) from the closure's own error.
func Validate(tx *txnode.Tx) error { return fn.Validate(tx) }

// WaitReads waits, in Durable mode, until every row tx read so far is durable (DB.Update
// does so before it returns its closure's own error, which may rest on a commit not yet
// durable: a balance found too low). It returns nil once they are (at once in WriteBack, or
// when nothing read is pending); txnode.ErrConflict when a batch holding one of them failed
// (what was read never happened: run the transaction again); the context's error if it ends
// first. The transaction stays open: Rollback it after. For a Tx from Begin, on its
// goroutine.
func WaitReads(tx *txnode.Tx) error { return fn.WaitReads(tx) }

// Serving returns nil while t's node may serve the table (its lease, or for a
// cluster-managed table its etcd grant, holds), else the error the table's reads and writes
// fail with (txnode.ErrLeaseExpired wrapping the grant's error, and txnode.ErrFenced once
// the store fenced the grant; txnode.ErrTableNotFound once dropped). One clock read or
// grant check; no allocation on success.
func Serving(t *txnode.Table) error { return fn.Serving(t) }

// Opened returns db's table name if the node has it open, nil if not (no store call, no
// grant taken): a move's flush finds there the table of a partition the Node owns through
// a handle the game let go.
func Opened(db *txnode.DB, name string) *txnode.Table { return fn.Opened(db, name) }

// Forget makes the node forget t's table, so that it can own it again later (a cluster
// node's release of a partition, or its lost grant: docs/cluster.md, "Owning again"): it
// closes the table to new commits (they fail with txnode.ErrForgotten), waits until every
// commit admitted before is durable at the store (in WriteBack mode it flushes them first),
// then drops the table's cached frames and pin, forgets its state and releases its grant (a
// cluster-managed table's etcd grant, through the release function of Open's grants,
// called with ctx; a local table's lease is left to lapse at the store), dropping nothing at
// the store. From then on every call of t and of the other handles of that state, and of
// transactions that touched it, fails with an error wrapping txnode.ErrForgotten (and
// txnode.ErrLeaseExpired), and the next DB.Table of the name acquires the table afresh: a
// new state, under a grant taken anew (the grants return the one they still hold, if it
// does), its rows fetched from the store again.
//
// When the flush fails (ctx ends, the commit pipeline failed), or ctx ends before the state
// is forgotten, nothing is forgotten: the table takes commits again and Forget returns the
// error. When the grant's release fails, the table is forgotten all the same and Forget
// returns the release's error, wrapped. Forgetting a state forgotten already (or whose
// table was dropped) is a no-op; txnode.ErrClosed after the DB's Close. Writes of t still
// running are not waited for: one that commits after the close fails. Any goroutine may
// call it.
func Forget(ctx context.Context, t *txnode.Table) error { return fn.Forget(t, ctx) }

// TableID returns t's table id in the store (the id of the table state t serves: a table
// dropped and created again there has a new one).
func TableID(t *txnode.Table) uint32 { return fn.TableID(t) }

// TableDB returns the transaction node t belongs to: a Tx uses only tables of its own DB.
func TableDB(t *txnode.Table) *txnode.DB { return fn.TableDB(t) }

// CacheBytes returns the cache budget txnode.Open makes of Options.CacheBytes n: the
// default (64 MiB) for 0, and at least the least cache (64 KiB). A coordinator checks its
// own PinBytes against it as Open does.
func CacheBytes(n int64) int64 { return fn.CacheBytes(n) }

// Held writes: what a partition move asks of a WriteBack owner before it freezes the source
// (docs/cluster.md, "Writes during a move"). HoldWrites refuses every commit and prepare that
// writes the table from its return on (txnode.ErrMoved: never acknowledged, so retried by the
// caller), reads go on; every commit admitted before has its version once it returns, so
// FlushHeld makes all of them durable; ResumeWrites admits them again (the move rolled back).

// Supersede marks old as no longer serving its partition, for good, when by (nil: none) is
// another table (not a handle of old's own state: Same): by serves it from now (a move's
// target, a heal's new transaction node). Every transaction that read old fails its
// validation from then on (txnode.ErrConflict: run it again, through by): nothing writes
// old's cache any more, so its versions prove nothing. Call it before by is published to
// transactions. It reports whether it marked old. Any goroutine; idempotent.
func Supersede(old, by *txnode.Table) bool { return fn.Supersede(old, by) }

// Same reports whether a and b are handles of one table state (one cache: DB.Table returns
// a new handle each call).
func Same(a, b *txnode.Table) bool { return fn.Same(a, b) }

// Serial orders table states as this process made them: of two states of one partition on
// one storage node (one forgotten and opened again, a heal's new transaction node's), the
// one with the larger serial is the later, current one.
func Serial(t *txnode.Table) uint64 { return fn.Serial(t) }

// HoldWrites refuses the commits that write t from now on with txnode.ErrMoved, until
// ResumeWrites. Any goroutine; idempotent.
func HoldWrites(t *txnode.Table) { fn.HoldWrites(t) }

// ResumeWrites ends HoldWrites. Idempotent.
func ResumeWrites(t *txnode.Table) { fn.ResumeWrites(t) }

// WritesHeld reports whether t's writes are held.
func WritesHeld(t *txnode.Table) bool { return fn.WritesHeld(t) }

// FlushHeld holds t's writes and waits until every commit of t's DB admitted before is
// durable (DB.Flush): the owner's side of a move's flush request.
func FlushHeld(ctx context.Context, t *txnode.Table) error { return fn.FlushHeld(t, ctx) }

// DurableTable is a read-only handle on a table this node does not own: each Get asks the
// store for the row (one round trip; nothing cached, no ownership taken, no lease kept). A
// storage node serves a reader that is not the table's holder only durable rows, so a row may
// be older than what the holder's cache (and its unflushed commits) has; the embedded store,
// which no other node can reach, serves what it has. Package cluster's node reads the
// partitions it does not own through it (docs/cluster.md). Handles are safe for concurrent
// use.
type DurableTable struct {
	d coordbridge.Durable[txnode.DB]
}

// OpenDurable opens a table of db for durable reads only (DurableTable), without taking its
// ownership: txnode.ErrTableNotFound when the store has no such table.
func OpenDurable(ctx context.Context, db *txnode.DB, name string) (*DurableTable, error) {
	ti, err := fn.OpenDurable(db, ctx, name)
	if err != nil {
		return nil, err
	}
	return &DurableTable{d: coordbridge.Durable[txnode.DB]{DB: db, Info: ti}}, nil
}

// CreateDurableClusterTable creates a cluster-managed table holding partition
// layout.Partition of a partitioned table (name is its name at the store:
// base.PartitionTableName), like CreateClusterTable, but takes no ownership: it returns a
// DurableTable. A name already in use is txnode.ErrTableExists (compare the existing one's
// Cluster and RowBytes to tell a retry from a clash).
func CreateDurableClusterTable(ctx context.Context, db *txnode.DB, name string, rowBytes int, layout ClusterLayout) (*DurableTable, error) {
	ti, err := fn.CreateDurableClusterTable(db, ctx, name, rowBytes, layout)
	if err != nil {
		return nil, err
	}
	return &DurableTable{d: coordbridge.Durable[txnode.DB]{DB: db, Info: ti}}, nil
}

// DB returns the transaction node the durable-read handle belongs to.
func (t *DurableTable) DB() *txnode.DB { return t.d.DB }

// Name returns the table's name at the store.
func (t *DurableTable) Name() string { return t.d.Info.Name }

// RowBytes returns the table's row size.
func (t *DurableTable) RowBytes() int { return t.d.Info.RowBytes }

// ID returns the table's id in the store, as it was when the handle was opened (a table
// dropped and created again there has a new one).
func (t *DurableTable) ID() uint32 { return t.d.Info.ID }

// Cluster returns a cluster-managed table's layout and partition (Partitions 0: a local table).
func (t *DurableTable) Cluster() ClusterLayout { return t.d.Info.Cluster }

// Get copies row id, as the store has it durably (see DurableTable), into dst, whose length
// must be the row size. txnode.ErrNotFound when the store has no such row.
func (t *DurableTable) Get(ctx context.Context, id uint64, dst []byte) error {
	return fn.DurableGet(&t.d, ctx, id, dst)
}

// Scan returns the rows of ids in [lo, hi) in id order, as the store has them durably (see
// DurableTable): the store's page directory skips empty ranges, and only the present rows of
// the pages read cross the wire. A read pass, not a snapshot. Row.Data stays valid until the
// loop asks for the next row. An error ends the sequence as its last element.
func (t *DurableTable) Scan(ctx context.Context, lo, hi uint64) iter.Seq2[txnode.Row, error] {
	return fn.DurableScan(&t.d, ctx, lo, hi)
}

// ScanAll returns every row of the table in id order, as Scan(ctx, 0, ∞).
func (t *DurableTable) ScanAll(ctx context.Context) iter.Seq2[txnode.Row, error] {
	return t.Scan(ctx, 0, ^uint64(0))
}
