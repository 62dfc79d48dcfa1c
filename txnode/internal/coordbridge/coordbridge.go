// Package coordbridge hands txnode's unexported coordinator surface to package
// txnode/txncoord, so that txnode's own page lists what a game uses. Rules:
//   - txnode fills the one Funcs in an init (Set); txncoord takes it once (Get) and wraps each
//     field as a typed function or method. txnode never imports txncoord.
//   - The state of txncoord's handles (Part, Turn, Durable) is declared here, so txncoord holds
//     it by value and txnode works on it in place: txnode declares a type of the same
//     underlying struct and converts the pointer. No allocation beyond txnode's own.
//   - Funcs is generic in txnode's types, which this package cannot name: DB, Table, Tx, Row,
//     Options.
package coordbridge

import (
	"context"
	"errors"
	"iter"
	"time"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/txnode/store"
)

// ErrNoTxnStore is returned by a prepare, a decide or an apply over a store that does not do
// two-phase commit (store.TxnStore).
var ErrNoTxnStore = errors.New("txnode: the store does not do two-phase commit")

// Grants hands out the etcd grants of the partitions of cluster-managed tables
// (txncoord.Grants, an alias). Any goroutine may call it.
type Grants interface {
	// Grant acquires the grant of partition part of the partitioned table table: its epoch
	// (the etcd revision that created the owner key), which the storage node verifies when
	// this node registers it; check, which returns nil while this node may serve the
	// partition (cluster.Ownership.Check: lock-free, allocation-free on success; it takes
	// the place of the storage node's lease); and release, which gives the grant up (the next
	// Grant is a new one, with a higher epoch). The error of a partition another node holds
	// matches cluster.ErrOwned.
	Grant(ctx context.Context, table string, part uint32) (epoch uint64, check func() error, release func(context.Context) error, err error)
}

// TxnInfo names a transaction of a two-phase commit and this part in it (txncoord.TxnInfo,
// which converts to it).
type TxnInfo struct {
	ID      [16]byte
	Lease   int64
	Index   uint16
	Primary string
}

// Part is the state of a prepared part (txncoord.Prepared; txnode's prepared).
type Part[Tx any] struct {
	Tx   *Tx            // holds the rows locked, the pins and the write set
	TS   store.TxnStore // the DB's store's two-phase commit side
	Info TxnInfo
	Done bool // applied or abandoned
}

// Turn is the state of a retry loop's cache turn (txncoord.CacheTurn; txnode's cacheTurn).
type Turn[DB any] struct {
	DB    *DB       // whose turn is held (nil: none)
	Held  bool      // the turn of DB is held
	Since time.Time // the first Wait: Options.CacheWait bounds the loop's waits in all
}

// Durable is the state of a durable-read handle (txncoord.DurableTable; txnode's
// durableTable).
type Durable[DB any] struct {
	DB   *DB
	Info base.TableInfo
}

// Funcs is txnode's coordinator surface, each field one unexported function of txnode.
type Funcs[DB, Table, Tx, Row, Options any] struct {
	Open func(ctx context.Context, opts Options, g Grants) (*DB, error)

	DecideTxn                 func(db *DB, ctx context.Context, id base.TxnID, lease int64, d base.Decision, count int) error
	ApplyTxn                  func(db *DB, ctx context.Context, id base.TxnID, d base.Decision) error
	CreateClusterTable        func(db *DB, ctx context.Context, table string, rowBytes int, layout base.ClusterLayout) (*Table, error)
	OpenDurable               func(db *DB, ctx context.Context, name string) (base.TableInfo, error)
	CreateDurableClusterTable func(db *DB, ctx context.Context, name string, rowBytes int, layout base.ClusterLayout) (base.TableInfo, error)

	DurableGet  func(d *Durable[DB], ctx context.Context, id uint64, dst []byte) error
	DurableScan func(d *Durable[DB], ctx context.Context, lo, hi uint64) iter.Seq2[Row, error]

	// PrepareLock is a prepare up to its validation (nil error: the rows locked and
	// validated); PrepareSend the rest, filling p (held: p holds the Tx, even with an error).
	// Split so that the caller allocates p only for a prepare that gets that far.
	PrepareLock func(tx *Tx) (store.TxnStore, error)
	PrepareSend func(tx *Tx, ts store.TxnStore, info TxnInfo, p *Part[Tx]) (held bool, err error)
	Validate    func(tx *Tx) error
	WaitReads   func(tx *Tx) error
	CacheBusy   func(tx *Tx) bool

	PartValidate       func(p *Part[Tx]) error
	PartApply          func(p *Part[Tx], ctx context.Context, d base.Decision) error
	PartApplyUncertain func(p *Part[Tx], ctx context.Context) (base.Decision, error)
	PartAbandon        func(p *Part[Tx])

	TurnWait    func(c *Turn[DB], tx *Tx) error
	TurnHold    func(c *Turn[DB], tx *Tx)
	TurnRelease func(c *Turn[DB])

	Serving      func(t *Table) error
	HoldWrites   func(t *Table)
	ResumeWrites func(t *Table)
	WritesHeld   func(t *Table) bool
	FlushHeld    func(t *Table, ctx context.Context) error
	Opened       func(db *DB, name string) *Table
	Supersede    func(old, by *Table) bool
	Same         func(a, b *Table) bool
	Serial       func(t *Table) uint64

	Forget  func(t *Table, ctx context.Context) error
	TableID func(t *Table) uint32
	TableDB func(t *Table) *DB

	// CacheBytes is the cache budget Open makes of Options.CacheBytes n.
	CacheBytes func(n int64) int64
}

var funcs any

// Set records txnode's Funcs; txnode calls it once, in an init.
func Set[DB, Table, Tx, Row, Options any](f *Funcs[DB, Table, Tx, Row, Options]) { funcs = f }

// Get returns the Funcs txnode recorded (txnode's init ran first: txncoord imports it).
func Get[DB, Table, Tx, Row, Options any]() *Funcs[DB, Table, Tx, Row, Options] {
	return funcs.(*Funcs[DB, Table, Tx, Row, Options])
}
