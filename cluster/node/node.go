package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/logicpage"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/txnode"
	"github.com/weftdb/weft/txnode/txncoord"
)

// Config is how Open joins a cluster.
type Config struct {
	// Etcd is how the node reaches the cluster's etcd (endpoints, prefix, TLS, auth).
	Etcd cluster.Config
	// Session is the node's ownership session: Owner (nonzero; also the owner id the node
	// gives every storage node, txnode.Options.OwnerID), Addr (where this node takes
	// requests: what a NotOwnerError names to the other nodes), TTL and margin.
	Session cluster.SessionConfig
	// Secret is the storage nodes' clients' secret (txnode.Options.Secret; their
	// server.Config.Secret): a game server's credential.
	Secret []byte
	// OperatorSecret is the storage nodes' operators' secret (their
	// server.Config.OperatorSecret), which Table.Move's mover dials with (docs/operations.md,
	// "Roles and credentials"). Empty: Secret, which moves only on storage nodes without any
	// secret (loopback); a game server that never moves a partition leaves it empty.
	OperatorSecret []byte
	// CacheBytes is the logical page cache of each storage node's transaction node
	// (txnode.Options.CacheBytes): the node's budget is this times the storage nodes it talks
	// to. txnode's default (64 MiB) when zero.
	CacheBytes int64
	// PinBytes is what the pinned partitions (Table.Pin) may hold of each storage node's
	// transaction node's cache (txnode.Options.PinBytes: half of CacheBytes when zero, at
	// most three quarters of it: Open fails above; none when negative).
	PinBytes int64
	// Durability of every commit (txnode.Options.Durability; Durable by default), and
	// WriteBack's flush period (txnode.Options.FlushInterval; txnode's default when zero).
	Durability    txnode.Durability
	FlushInterval time.Duration
	// DialTimeout and RequestTimeout bound each storage node's dial and requests (txnode's
	// defaults when zero).
	DialTimeout, RequestTimeout time.Duration
	// OwnerLookupTimeout bounds the etcd read that names a partition's holder in a
	// NotOwnerError (DefaultOwnerLookupTimeout when zero): with etcd unreachable, a refused
	// write fails within it (the error's Lookup says why), not at the caller's deadline.
	OwnerLookupTimeout time.Duration
	// Logger receives warnings (slog.Default when nil).
	Logger *slog.Logger
}

// DefaultOwnerLookupTimeout is Config.OwnerLookupTimeout's default.
const DefaultOwnerLookupTimeout = 2 * time.Second

// Node is a game server's view of a cluster: its partitioned tables over every storage node
// (routing each row by id, cluster.Layout.Of), the partitions it owns for writing under its
// session, and one transaction node (txnode.DB) per storage node it talks to, dialled when a
// table it opens first needs that storage node. Its methods may be called from any goroutine.
type Node struct {
	cfg  Config
	c    *cluster.Client
	sess *cluster.Session
	w    *cluster.MapWatcher // the partition map the Tables follow (follow.go)
	log  *slog.Logger

	// down is set once Close starts (closed, under mu, with it): what the Table and Tx
	// methods check first, lock-free.
	down atomic.Bool

	mu     sync.Mutex
	closed bool
	dbs    map[string]*storeConn // by storage node address
	tables map[string]*Table     // by name
	// handles are every Table addTable made, weakly (pruned as they are collected): a handle
	// OpenTable replaced after a move still follows the map and may own partitions, so a
	// heal re-registers its grants too (heal.go reown). Guarded by mu.
	handles []weak.Pointer[Table]
	// heals are, by storage node address, the transaction nodes found dead and not
	// replaced yet (heal.go). Guarded by mu.
	heals map[string]*pendingHeal

	// sick is len(heals): while nonzero, the Table operations check their partition's
	// transaction node first (Node.db); lock-free otherwise.
	sick atomic.Int32

	// Two-phase commits (coord.go): txnSeq numbers this node's transactions; bg is the
	// context of the ones finished in the background (finishing), which Close cancels and
	// waits for before it closes the transaction nodes.
	txnSeq    atomic.Uint64
	bg        context.Context
	bgCancel  context.CancelFunc
	finishing sync.WaitGroup
	// recording counts the goroutines recording aborts at their primaries in the
	// background (recordAbortLater: at most abortRecordMax; also in finishing), aborts the
	// ones waiting for them (at most abortRecordQueue). Guarded by mu.
	recording int
	aborts    []abortRecord

	// flushReqs holds the mover epoch of each flush request on a partition this node owns
	// (moveFlushKey → int64; moveflush.go), changed under flushMu, which also orders the
	// holds and resumes of the partitions' tables; flushClosed, under flushMu, stops new
	// flush goroutines once Close began.
	flushReqs   sync.Map
	flushMu     sync.Mutex
	flushClosed bool
	// flushEnds counts the holds this node's flush requests ended (resumeAfterMove, before
	// it resumes a table): a write refused as held whose hold ended before the refusal was
	// told sees it changed (heldWrite).
	flushEnds atomic.Uint64

	// pub is the owned table serving each partition (publish.go).
	pub published
}

// storeConn is the transaction node of one storage node: dialled once (ready closed when db
// or err is set; a failed dial is forgotten, so the next use dials again), replaced once it
// died (heal.go).
type storeConn struct {
	ready chan struct{}
	db    *txnode.DB
	err   error
	// keep, set before a dead db is closed, makes its grants' releases no-ops: the grants
	// stay this session's, for the next transaction node of the storage node to register.
	keep atomic.Bool
}

// Open connects to etcd and starts the node's session. Close ends both.
func Open(ctx context.Context, cfg Config) (*Node, error) {
	if cfg.Session.Owner == 0 {
		return nil, fmt.Errorf("node: %w: Session.Owner must be set (the node's owner id)", cluster.ErrInvalid)
	}
	// txnode.Open's rule for PinBytes, checked here, not at the first table of a storage node.
	if cache := txncoord.CacheBytes(cfg.CacheBytes); cfg.PinBytes > cache*3/4 {
		return nil, fmt.Errorf("node: %w: PinBytes %d is over three quarters of CacheBytes %d (transactions need the rest)", cluster.ErrInvalid, cfg.PinBytes, cache)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.OwnerLookupTimeout <= 0 {
		cfg.OwnerLookupTimeout = DefaultOwnerLookupTimeout
	}
	if cfg.Etcd.Logger == nil {
		cfg.Etcd.Logger = cfg.Logger
	}
	c, err := cluster.Connect(ctx, cfg.Etcd)
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	var self atomic.Pointer[Node] // the session's MoveFlush calls it once it exists
	scfg := cfg.Session
	scfg.WriteBack = cfg.Durability == txnode.WriteBack
	scfg.MoveFlush = func(o *cluster.Ownership, epoch int64) {
		if n := self.Load(); n != nil {
			n.onMoveFlush(o, epoch)
		}
	}
	s, err := c.NewSession(ctx, scfg)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("node: %w", err)
	}
	w, err := c.WatchMap(ctx)
	if err != nil {
		s.Close(ctx)
		c.Close()
		return nil, fmt.Errorf("node: %w", err)
	}
	bg, cancel := context.WithCancel(context.Background())
	n := &Node{cfg: cfg, c: c, sess: s, w: w, log: cfg.Logger, bg: bg, bgCancel: cancel,
		dbs: make(map[string]*storeConn), tables: make(map[string]*Table), heals: make(map[string]*pendingHeal)}
	self.Store(n)
	return n, nil
}

// Session returns the node's ownership session (its lease, deadline; closing it gives up
// every partition at once, as a node that died would after its TTL).
func (n *Node) Session() *cluster.Session { return n.sess }

// Client returns the node's etcd client.
func (n *Node) Client() *cluster.Client { return n.c }

// Close stops finishing the two-phase commits left to the background (the storage nodes'
// resolvers finish them), flushes and closes every storage node's transaction node
// (releasing the partitions owned there), then ends the session and the etcd connection. It is idempotent; it waits
// only as long as ctx allows (txnode.DB.Close).
func (n *Node) Close(ctx context.Context) error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	n.down.Store(true)
	conns := n.dbs
	n.dbs = nil
	heals := n.heals
	n.heals = nil
	n.sick.Store(0)
	n.mu.Unlock()
	// Dead transaction nodes not replaced yet (heal.go): closed here unless a dial of
	// their successor closes them (DB.Close is idempotent).
	for addr, h := range heals {
		n.closedDead(addr, h, h.old.Close(ctx))
	}
	// Two-phase commits still finishing in the background give up (their parts are
	// abandoned: the storage nodes' resolvers finish them) before their DBs close.
	n.flushMu.Lock()
	n.flushClosed = true // no flush for a move starts from here (moveflush.go)
	n.flushMu.Unlock()
	n.bgCancel()
	n.finishing.Wait()
	var errs []error
	for addr, sc := range conns {
		select {
		case <-sc.ready:
		case <-ctx.Done():
			// A dial in flight: it closes what it opens itself once it sees the Node closed.
			errs = append(errs, fmt.Errorf("node: close: storage node %s still dialling: %w", addr, ctx.Err()))
			continue
		}
		if sc.db != nil {
			if err := sc.db.Close(ctx); err != nil {
				errs = append(errs, fmt.Errorf("node: close the transaction node of %s: %w", addr, err))
			}
		}
	}
	n.w.Close()
	if err := n.sess.Close(ctx); err != nil && !errors.Is(err, cluster.ErrSessionClosed) {
		errs = append(errs, fmt.Errorf("node: %w", err))
	}
	if err := n.c.Close(); err != nil {
		errs = append(errs, fmt.Errorf("node: close etcd client: %w", err))
	}
	return errors.Join(errs...)
}

// closedErr is ErrClosed once Close started, else nil.
func (n *Node) closedErr() error {
	if n.down.Load() {
		return ErrClosed
	}
	return nil
}

// after maps an error of the layers below: once Close started, a transaction node's (or the
// etcd client's) closed error is ErrClosed too.
func (n *Node) after(err error) error {
	if err != nil && n.down.Load() && !errors.Is(err, ErrClosed) {
		return fmt.Errorf("%w (%w)", ErrClosed, err)
	}
	return err
}

// db returns the transaction node of the storage node at addr, dialling it on first use, and
// replacing it when it died (txnode.DB.Err: the storage node stayed unreachable past
// RequestTimeout, or its commit pipeline failed for good): heal.go.
func (n *Node) db(ctx context.Context, addr string) (*txnode.DB, error) {
	for {
		n.mu.Lock()
		if n.closed {
			n.mu.Unlock()
			return nil, ErrClosed
		}
		sc := n.dbs[addr]
		if sc == nil {
			sc = &storeConn{ready: make(chan struct{})}
			n.dbs[addr] = sc
			n.mu.Unlock()
			return n.dial(ctx, addr, sc)
		}
		n.mu.Unlock()
		select {
		case <-sc.ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if sc.err != nil {
			return nil, sc.err
		}
		derr := sc.db.Err()
		if derr == nil {
			return sc.db, nil
		}
		if errors.Is(derr, txnode.ErrClosed) && n.down.Load() {
			return nil, ErrClosed
		}
		n.replace(addr, sc, derr) // the next round dials the new one (or waits for it)
	}
}

// grants is the txncoord.Grants of the node's transaction nodes, on its session: Own takes partitions at once
// (another node's hold is an *OwnedError), OwnWait waits for the holder to go (the context
// says which: waitKey).
// Its releases do nothing once keep is set (the transaction node is being replaced: heal.go),
// nor called with a context of holdGrantKey, nor, called with a context of keepGrantKey,
// while a move of the partition is recorded (keepGrantKey).
type grants struct {
	s    *cluster.Session
	c    *cluster.Client
	keep *atomic.Bool
}

type waitKey struct{}

func (g grants) Grant(ctx context.Context, table string, part uint32) (uint64, func() error, func(context.Context) error, error) {
	var o *cluster.Ownership
	var err error
	if ctx.Value(waitKey{}) != nil {
		o, err = g.s.AcquireWait(ctx, table, part)
	} else {
		o, err = g.s.Acquire(ctx, table, part)
	}
	if err != nil {
		return 0, nil, nil, err
	}
	release := o.Release
	return o.Epoch(), o.Check, func(ctx context.Context) error {
		if g.keep.Load() || ctx.Value(holdGrantKey{}) != nil || ctx.Value(keepGrantKey{}) != nil && g.moving(ctx, table, part) {
			return nil
		}
		return release(ctx)
	}, nil
}

// keepGrantKey, in the context of a registration (txnode.DB.Table: Own, a move's follow, a
// heal's re-registration), keeps the grant when the storage node refuses it while a move of
// the partition is recorded in etcd. txnode releases a refused grant (with the
// registration's context) and takes a new one, but a refusal during a move (the frozen
// source's or the not yet live target's storenode.ErrMoved) is no reason to give the grant
// up: the switch keeps it and the follow registers it with the target (follow.go), and
// released, the partition could change hands during the move (and another handle of this
// node owning it under the same grant would lose it). The follow releases it itself if it
// gives up (forget). Outside a move (no record, or etcd not answering) a refused grant is
// released as txnode does.
type keepGrantKey struct{}

// holdGrantKey, in the context of txncoord.Forget (own.go, table.go tableAfresh), keeps
// the grant whatever happens: the node releases it itself (Release, after the forget), or it
// is lost already, or the session's grant is the one to register again (a move's follow).
type holdGrantKey struct{}

// moving reports whether a move of partition part of table is recorded in etcd (false when
// etcd does not answer within a second, or within ctx).
func (g grants) moving(ctx context.Context, table string, part uint32) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, ok, err := g.c.ReadMove(ctx, table, part)
	return err == nil && ok
}

// CreateTable creates a partitioned table of rowBytes-byte rows: partitions partitions of
// stripePages-page stripes (cluster.Layout), partition p on storage node
// nodes[p%len(nodes)]. It writes the partition map in etcd first (cluster.Client.CreateTable),
// then creates each partition's table on its storage node (base.PartitionTableName,
// cluster-managed, owned by nobody yet: Own takes partitions). A retry with the same
// arguments completes a creation that stopped between the two (and returns the table when it
// is complete); a table of that name with another layout, placement or row size is
// cluster.ErrTableExists, and so is a first creation (the map has no such table) that finds
// a partition table of the name already on its storage node (a dropped table's leftover: it
// is not adopted). It does not own any partition.
func (n *Node) CreateTable(ctx context.Context, name string, rowBytes, partitions, stripePages int, nodes []string) (*Table, error) {
	if err := n.closedErr(); err != nil {
		return nil, err
	}
	if len(nodes) == 0 {
		return nil, fmt.Errorf("node: %w: no storage nodes for table %q", cluster.ErrInvalid, name)
	}
	if partitions <= 0 || partitions > cluster.PartitionsMax || stripePages <= 0 || stripePages > cluster.StripePagesMax {
		return nil, fmt.Errorf("node: %w: table %q: %d partitions of %d-page stripes", cluster.ErrInvalid, name, partitions, stripePages)
	}
	// Everything a storage node would refuse in step 2 is refused before step 1: a map entry
	// whose partition tables can never be created would hold the name for good.
	if _, err := logicpage.NewGeometry(rowBytes); err != nil {
		return nil, fmt.Errorf("node: create table %q: %w", name, err)
	}
	if err := storageName(base.PartitionTableName(name, uint32(partitions-1))); err != nil {
		return nil, fmt.Errorf("node: create table %q: its partition tables' names (%q): %w",
			name, base.PartitionTableName(name, uint32(partitions-1)), err)
	}
	layout := cluster.Layout{Partitions: uint32(partitions), StripePages: uint32(stripePages)}
	place := make([]string, partitions)
	for p := range place {
		place[p] = nodes[p%len(nodes)]
	}
	if err := n.noLeftovers(ctx, name, place); err != nil {
		return nil, err
	}
	tm, err := n.c.CreateTable(ctx, name, layout, place)
	if errors.Is(err, cluster.ErrTableExists) {
		// A retry, or another node's table: the same layout and placement is a retry.
		if tm, err = n.readTable(ctx, name); err == nil && (tm.Layout != layout || !slices.Equal(tm.Nodes, place)) {
			err = fmt.Errorf("node: %w: %q has layout %+v on %v, not %+v on %v", cluster.ErrTableExists, name, tm.Layout, tm.Nodes, layout, place)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("node: create table %q: %w", name, err)
	}
	durable := make([]*txncoord.DurableTable, partitions)
	for p := range durable {
		db, err := n.db(ctx, tm.Nodes[p])
		if err != nil {
			return nil, err
		}
		pname := base.PartitionTableName(name, uint32(p))
		cl := txncoord.ClusterLayout{Partitions: layout.Partitions, StripePages: layout.StripePages, Partition: uint32(p)}
		d, err := txncoord.CreateDurableClusterTable(ctx, db, pname, rowBytes, cl)
		if errors.Is(err, txnode.ErrTableExists) {
			if d, err = txncoord.OpenDurable(ctx, db, pname); err == nil && (d.RowBytes() != rowBytes || d.Cluster() != cl) {
				err = fmt.Errorf("%w: %q on %s has %d-byte rows, layout %+v, not %d and %+v",
					cluster.ErrTableExists, pname, tm.Nodes[p], d.RowBytes(), d.Cluster(), rowBytes, cl)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("node: create table %q partition %d on %s: %w", name, p, tm.Nodes[p], err)
		}
		durable[p] = d
	}
	t, err := n.addTable(tm, durable)
	if err != nil {
		return nil, err
	}
	return t, t.current(ctx)
}

// noLeftovers refuses, before a first creation writes the map, partition tables of the name
// already on their storage nodes: a table dropped from the map (cluster.Client.DropTable)
// leaves them there, rows and all, and step 2 would take them as the new table's. When the
// map has the table already (a retry, or another node's table) it does nothing: step 1
// says which. One listing per storage node.
func (n *Node) noLeftovers(ctx context.Context, name string, place []string) error {
	_, err := n.readTable(ctx, name)
	switch {
	case err == nil:
		return nil
	case !errors.Is(err, cluster.ErrTableNotFound):
		return fmt.Errorf("node: create table %q: %w", name, err)
	}
	want := make(map[string][]uint32) // storage node -> its partitions
	for p, addr := range place {
		want[addr] = append(want[addr], uint32(p))
	}
	for addr, ps := range want {
		db, err := n.db(ctx, addr)
		if err != nil {
			return err
		}
		infos, err := db.Tables(ctx)
		if err != nil {
			return fmt.Errorf("node: create table %q: list the tables of %s: %w", name, addr, err)
		}
		have := make(map[string]bool, len(infos))
		for _, ti := range infos {
			have[ti.Name] = true
		}
		for _, p := range ps {
			if pname := base.PartitionTableName(name, p); have[pname] {
				return fmt.Errorf("node: create table %q: %w: partition table %q is already on storage node %s, though the map has no such table (a dropped table's, rows and all: drop it there first)",
					name, cluster.ErrTableExists, pname, addr)
			}
		}
	}
	return nil
}

// OpenTable opens a partitioned table: it reads the partition map (linearizable) and opens
// every partition's table on its storage node for durable reads, dialling those storage
// nodes. A table already open is returned as it is while the map routes it alike; after a
// partition switch (a move) or a drop and re-creation it is opened afresh (the old handle
// follows the map too: follow.go). ErrIncomplete when a partition table is
// missing (CreateTable stopped midway: run it again); cluster.ErrTableNotFound when the map
// has no such table.
func (n *Node) OpenTable(ctx context.Context, name string) (*Table, error) {
	n.mu.Lock()
	t := n.tables[name]
	closed := n.closed
	n.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	tm, err := n.readTable(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("node: open table %q: %w", name, err)
	}
	if t != nil && sameMap(t.m, tm) {
		return t, nil
	}
	durable := make([]*txncoord.DurableTable, len(tm.Nodes))
	rowBytes := 0
	for p, addr := range tm.Nodes {
		db, err := n.db(ctx, addr)
		if err != nil {
			return nil, err
		}
		d, err := txncoord.OpenDurable(ctx, db, base.PartitionTableName(name, uint32(p)))
		if errors.Is(err, txnode.ErrTableNotFound) {
			return nil, fmt.Errorf("node: open table %q: partition %d is not on storage node %s: %w (%w)", name, p, addr, ErrIncomplete, err)
		}
		if err != nil {
			return nil, fmt.Errorf("node: open table %q partition %d on %s: %w", name, p, addr, err)
		}
		cl := d.Cluster()
		if cl.Partitions != tm.Layout.Partitions || cl.StripePages != tm.Layout.StripePages || cl.Partition != uint32(p) ||
			(rowBytes != 0 && d.RowBytes() != rowBytes) {
			return nil, fmt.Errorf("node: open table %q: partition %d on %s is %+v of %d-byte rows, the map says %+v: %w",
				name, p, addr, cl, d.RowBytes(), tm.Layout, cluster.ErrTableExists)
		}
		rowBytes = d.RowBytes()
		durable[p] = d
	}
	if h := raceHook; h != nil {
		h("open")
	}
	t, err = n.addTable(tm, durable)
	if err != nil {
		return nil, err
	}
	return t, t.current(ctx)
}

// storageName checks a storage node's table name rule (1..64 bytes of [A-Za-z0-9_.-]):
// storenode.ErrBadName otherwise.
func storageName(name string) error {
	if len(name) == 0 || len(name) > 64 {
		return fmt.Errorf("%w: %d bytes (1..64)", storenode.ErrBadName, len(name))
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			return fmt.Errorf("%w: byte %q (want [A-Za-z0-9_.-])", storenode.ErrBadName, c)
		}
	}
	return nil
}

func (n *Node) readTable(ctx context.Context, name string) (*cluster.TableMap, error) {
	m, err := n.c.ReadMap(ctx)
	if err != nil {
		return nil, err
	}
	return m.Table(name)
}

// sameMap reports whether two reads of a table's map entry route alike: the same table
// (creation revision), every partition on the same storage node.
func sameMap(a, b *cluster.TableMap) bool {
	return a.Created == b.Created && a.Layout == b.Layout && slices.Equal(a.Nodes, b.Nodes)
}

// addTable registers an opened table (or returns the one another call registered first).
func (n *Node) addTable(tm *cluster.TableMap, durable []*txncoord.DurableTable) (*Table, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, ErrClosed
	}
	if t := n.tables[tm.Name]; t != nil && sameMap(t.m, tm) {
		return t, nil
	}
	t := newTable(n, tm, durable)
	n.tables[tm.Name] = t
	n.handles = slices.DeleteFunc(n.handles, func(w weak.Pointer[Table]) bool { return w.Value() == nil })
	n.handles = append(n.handles, weak.Make(t))
	return t, nil
}
