package storenode

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"strings"
	"time"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/logicpage"
)

// Cluster-managed tables (docs/cluster.md, "The storage node: fencing by grant revision").
// Partition p of a partitioned table T of a cluster lives on its storage node as a table of
// its own, named base.PartitionTableName(T, p), created cluster-managed (CreateClusterTable): its
// catalog entry carries the table's layout and the partition, so a restart, a restore and
// Check know it. Invariants:
//
//   - A table is either local or cluster-managed, for ever. A local table's epochs are this
//     node's own counter (Acquire); a cluster table's are etcd revisions, registered by their
//     owners (RegisterGrant) and accepted only after GrantVerifier proved them (a
//     linearizable read of the owner key), never on trust; each one accepted is above every
//     epoch the table had, and is logged and synced before it is answered.
//   - The storage node's lease timer does not decide a cluster table's grants: etcd does. A
//     current grant stays current until a higher one is registered.
//   - A cluster table holds only ids of its partition: AllocIDs hands out ids of its
//     partition's stripes only, and a commit segment of a page of another partition is
//     refused.
//   - etcd is never called with mu (or any engine lock) held, at most grantVerifySlots
//     verifications run at once, each bounded by Options.GrantVerifyTimeout; a connection
//     gets a slot at once or is refused (verify_slots.go).

// PartitionNextID is the smallest id >= id of l's partition, false when there is none below
// MaxRowID (cluster.Layout.Next bounded by the table's id space).
func PartitionNextID(l base.ClusterLayout, id uint64) (uint64, bool) {
	if id >= MaxRowID {
		// No id of the table's space is above it; and near 2^64 the stripe start below
		// would wrap around.
		return 0, false
	}
	stripe := uint64(l.StripePages) * logicpage.RowsPerPage
	round := stripe * uint64(l.Partitions) // at most 2^16 * 2^26: no overflow
	start := id - id%round + uint64(l.Partition)*stripe
	switch {
	case id < start:
	case id-start < stripe:
		start = id
	default:
		var carry uint64
		if start, carry = bits.Add64(start, round, 0); carry != 0 {
			return 0, false
		}
	}
	if start >= MaxRowID {
		return 0, false
	}
	return start, true
}

// layoutStripeEnd is one past the last id of l's stripe holding id.
func layoutStripeEnd(l base.ClusterLayout, id uint64) uint64 {
	stripe := uint64(l.StripePages) * logicpage.RowsPerPage
	return id - id%stripe + stripe
}

// clusterTableName returns the partitioned table's name of the storage node's table name
// holding partition p, false when name does not end in p's suffix or leaves no name before it.
func clusterTableName(name string, p uint32) (string, bool) {
	t, ok := strings.CutSuffix(name, base.PartitionTableName("", p))
	return t, ok && t != ""
}

// GrantVerifier proves the etcd grants of cluster-managed tables. Package cluster implements
// it on an etcd client (cluster.GrantVerifier); storenode does not import it, so a storage
// node without a cluster links no etcd. Its methods are called from request goroutines,
// never with an engine lock held and never on an event loop, at most grantVerifySlots at
// once, each with a context bounded by Options.GrantVerifyTimeout.
type GrantVerifier interface {
	// VerifyGrant returns nil only when a linearizable read found partition's owner key of
	// table present, created at revision epoch, naming owner. An answer that the grant is
	// not current (no key, another revision or owner) wraps ErrFenced; etcd unreachable or
	// slow is any other error.
	VerifyGrant(ctx context.Context, table string, partition uint32, owner, epoch uint64) error
	// Revision returns etcd's current revision (a linearizable read): the floor of a restored
	// copy's cluster tables.
	Revision(ctx context.Context) (uint64, error)
}

// TableMapVerifier is implemented by a GrantVerifier that can say whether etcd's partition
// map still has a table (cluster.GrantVerifier does). A cluster-managed table's drop by an
// owner other than its registered holder whose etcd grant is current is allowed only once
// etcd's map no longer has the table (DropTable); without a TableMapVerifier it is refused.
// Any goroutine.
type TableMapVerifier interface {
	// TableMapped reports, from a linearizable read, whether etcd's partition map has the
	// partitioned table table; an error when etcd did not answer.
	TableMapped(ctx context.Context, table string) (bool, error)
}

// verifyClusterDrop returns nil when owner may drop cluster table t, whose registered holder
// and epoch were holder and epoch: owner is the holder and etcd says that grant is current
// (VerifyGrant), or etcd's map no longer has the table (verifyUnmapped). ErrGrantUnverified
// when etcd did not answer. No lock held; it waits for etcd.
func (e *Engine) verifyClusterDrop(t *table, owner, holder, epoch uint64) error {
	if holder != 0 && holder == owner {
		base, _ := clusterTableName(t.name, t.cluster.Partition)
		err := e.verifyGrant(context.Background(), base, t.cluster.Partition, owner, epoch)
		if err == nil || !errors.Is(err, ErrFenced) {
			return err // current, or etcd did not say (ErrGrantUnverified, ErrClosed)
		}
		// Lapsed (another node's grant, or the table gone from the map): as any owner.
	}
	return e.verifyUnmapped(t)
}

// verifyUnmapped returns nil only when etcd's map no longer has t's partitioned table,
// ErrTableOwned when it has it (or no TableMapVerifier can say), ErrGrantUnverified when
// etcd did not answer within GrantVerifyTimeout. No lock held; it waits for etcd.
func (e *Engine) verifyUnmapped(t *table) error {
	base, _ := clusterTableName(t.name, t.cluster.Partition)
	mv, ok := e.opts.GrantVerifier.(TableMapVerifier)
	if !ok {
		return fmt.Errorf("%w: cluster table %q: drop it from its holder (this storage node cannot ask etcd whether the table is gone from the map)", ErrTableOwned, t.name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.opts.GrantVerifyTimeout)
	defer cancel()
	mapped, err := mv.TableMapped(ctx, base)
	if err != nil {
		return fmt.Errorf("%w: cluster table %q: is it still in etcd's map: %w", ErrGrantUnverified, t.name, err)
	}
	if mapped {
		return fmt.Errorf("%w: cluster table %q is still in etcd's partition map: drop it from its holder, or drop the table from the map first", ErrTableOwned, t.name)
	}
	return nil
}

// grantVerifySlots bounds the grant verifications (etcd reads) running at once.
const grantVerifySlots = 16

// DefaultGrantVerifyTimeout is Options.GrantVerifyTimeout's default.
const DefaultGrantVerifyTimeout = 5 * time.Second

// CreateClusterTable creates a cluster-managed table of rows of rowBytes bytes holding
// partition l.Partition of a partitioned table: name must be base.PartitionTableName(table,
// l.Partition). Its grants come from etcd only (RegisterGrant); its ids are those of the
// partition's stripes.
func (e *Engine) CreateClusterTable(name string, rowBytes int, l base.ClusterLayout) (base.TableInfo, error) {
	return e.createClusterTable(name, rowBytes, l, 0, false)
}

// CreateClusterTableAs is CreateClusterTable on behalf of owner (a client's session), under
// Options.MaxTablesPerOwner as CreateTableAs.
func (e *Engine) CreateClusterTableAs(name string, rowBytes int, l base.ClusterLayout, owner uint64) (base.TableInfo, error) {
	return e.createClusterTable(name, rowBytes, l, owner, true)
}

func (e *Engine) createClusterTable(name string, rowBytes int, l base.ClusterLayout, owner uint64, as bool) (base.TableInfo, error) {
	if err := l.Validate(); err != nil {
		return base.TableInfo{}, fmt.Errorf("storenode: %w", err)
	}
	if _, ok := clusterTableName(name, l.Partition); !ok {
		return base.TableInfo{}, fmt.Errorf("%w: cluster table %q: the name of partition %d of table T is %s",
			ErrBadName, name, l.Partition, base.PartitionTableName("T", l.Partition))
	}
	return e.createTable(name, rowBytes, l, owner, as)
}

// RegisterGrant registers owner's etcd grant of epoch (the owner key's CreateRevision) for
// the cluster table tableID. A grant already current (same owner and epoch) is a renewal:
// answered without an etcd read, but only once its ownership record is durable (a
// concurrent registration's may still wait for its fsync; ctx bounds that wait,
// ErrGrantUnverified when it ends first). Otherwise epoch must be above the table's epoch (ErrFenced, no etcd read:
// a lower or equal one can never become current), the GrantVerifier must prove it, and then
// it is logged and synced (the ownership record) before RegisterGrant returns; a grant that
// lost the race to a higher one meanwhile is ErrFenced. A local table refuses it
// (ErrGrantKind); so does a node without a GrantVerifier (ErrNoVerifier). ctx bounds the
// wait for a verification slot and the verification (with Options.GrantVerifyTimeout). Any
// goroutine but an event loop: it may wait for etcd.
func (e *Engine) RegisterGrant(ctx context.Context, tableID uint32, owner, epoch uint64) (base.Grant, error) {
	return e.RegisterGrantFrom(ctx, tableID, owner, epoch, 0)
}

// RegisterGrantFrom is RegisterGrant for a request of connection conn (nonzero: a storage
// node's session), which must still hold owner's identity (HoldsIdent) when the grant or
// renewal makes its incarnation the table's holder incarnation (holderReads), checked with
// that incarnation's read: else ErrIdentityLost. The etcd verification of a new grant may
// take a while, during which another incarnation may claim the id. A connection's
// registration waits for no verification slot: one it may not take now (at most
// grantVerifyConnMax per connection, verify_slots.go) is refused at once with
// ErrGrantUnverified. Any goroutine but an event loop.
func (e *Engine) RegisterGrantFrom(ctx context.Context, tableID uint32, owner, epoch, conn uint64) (base.Grant, error) {
	g, registered, err := e.registerGrant(ctx, tableID, owner, epoch, conn)
	switch {
	case registered:
		e.stats.grantsRegistered.Add(1)
	case errors.Is(err, ErrGrantUnverified):
		e.stats.grantsUnverified.Add(1)
	case errors.Is(err, ErrFenced):
		e.stats.grantsRefused.Add(1)
	}
	return g, err
}

// registerGrant is RegisterGrant; registered reports a new grant logged.
func (e *Engine) registerGrant(ctx context.Context, tableID uint32, owner, epoch, conn uint64) (_ base.Grant, registered bool, _ error) {
	if owner == 0 || owner == MoveWriter || epoch == 0 {
		return base.Grant{}, false, fmt.Errorf("%w: etcd grant of owner %d epoch %d", ErrMalformed, owner, epoch)
	}
	t, table, part, curLSN, err := e.registerCheck(tableID, owner, epoch, conn)
	if err != nil {
		return base.Grant{}, false, err
	}
	if curLSN != 0 { // a renewal: answered once the grant's record is durable
		if err := e.waitGrantDurable(ctx, curLSN); err != nil {
			return base.Grant{}, false, err
		}
		return t, false, nil
	}
	if err := e.verifyGrantFrom(ctx, conn, table, part, owner, epoch); err != nil {
		return base.Grant{}, false, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.usable(); err != nil {
		return base.Grant{}, false, err
	}
	tb, err := e.table(tableID)
	if err != nil {
		return base.Grant{}, false, err
	}
	if err := e.identFenced(owner); err != nil {
		return base.Grant{}, false, err
	}
	if err := e.moveRefuses(tb); err != nil {
		return base.Grant{}, false, err
	}
	inc, err := e.identIncFrom(owner, conn)
	if err != nil {
		return base.Grant{}, false, err
	}
	e.leaseMu.Lock()
	if tb.dropping {
		e.leaseMu.Unlock()
		return base.Grant{}, false, fmt.Errorf("%w: id %d", ErrTableNotFound, tableID)
	}
	if tb.holder == owner && tb.epoch == epoch { // registered meanwhile by a concurrent call
		e.leaseMu.Unlock()
		g := e.grant(tb, owner)
		g.Lease = 0
		// Answered only once that call's record is durable, as that call is.
		lsn := tb.grantLSN
		e.mu.Unlock()
		err := e.waitGrantDurable(ctx, lsn)
		e.mu.Lock()
		if err != nil {
			return base.Grant{}, false, err
		}
		return g, false, nil
	}
	if epoch <= tb.epoch {
		e.leaseMu.Unlock()
		return base.Grant{}, false, fmt.Errorf("%w: table %q: etcd grant of revision %d is not above the table's %d", ErrFenced, tb.name, epoch, tb.epoch)
	}
	if err := e.grantWaitsForTxns(tb); err != nil {
		e.leaseMu.Unlock()
		return base.Grant{}, false, err
	}
	if e.opts.Proposer != nil {
		e.leaseMu.Unlock()
		return e.registerGrantProposed(tb, owner, epoch, inc)
	}
	oldHolder, oldEpoch, oldInc := tb.holder, tb.epoch, tb.holderInc
	e.applyGrantOwnerLocked(tb, owner, epoch)
	tb.holderInc = inc
	e.leaseMu.Unlock()
	e.scratch = appendGrantOwnerRecord(e.scratch[:0], tb.id, owner, epoch)
	ch := make(chan error, 1)
	lsn, err := e.appendRecord(kindGrantOwner, e.scratch, true, func(_ uint64, err error) { ch <- err })
	if err != nil {
		e.leaseMu.Lock()
		tb.holder, tb.epoch, tb.holderInc = oldHolder, oldEpoch, oldInc
		e.leaseMu.Unlock()
		return base.Grant{}, false, err
	}
	tb.grantLSN = lsn
	g := e.grant(tb, owner)
	g.Lease = 0
	e.mu.Unlock()
	err = <-ch
	e.mu.Lock()
	if err != nil {
		return base.Grant{}, false, err
	}
	return g, true, nil
}

// registerCheck is RegisterGrant's first look, under mu: the table is a cluster table, the
// grant current or above the table's epoch. For a current grant it returns the grant and
// curLSN, the LSN its record must be durable through before it is answered (a record of a
// concurrent registration may still wait for its fsync); otherwise the partitioned table's
// name and the partition to verify.
func (e *Engine) registerCheck(tableID uint32, owner, epoch, conn uint64) (g base.Grant, table string, part uint32, curLSN uint64, err error) {
	if e.opts.GrantVerifier == nil {
		return base.Grant{}, "", 0, 0, fmt.Errorf("%w: this storage node has no etcd configured", ErrNoVerifier)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.usable(); err != nil {
		return base.Grant{}, "", 0, 0, err
	}
	if err := e.checkLeader(); err != nil {
		return base.Grant{}, "", 0, 0, err
	}
	t, err := e.table(tableID)
	if err != nil {
		return base.Grant{}, "", 0, 0, err
	}
	if !t.cluster.IsCluster() {
		return base.Grant{}, "", 0, 0, fmt.Errorf("%w: table %q is local: its grants are this storage node's (Acquire without the etcd-grant flag)", ErrGrantKind, t.name)
	}
	if err := e.identFenced(owner); err != nil {
		return base.Grant{}, "", 0, 0, err
	}
	if err := e.moveRefuses(t); err != nil {
		return base.Grant{}, "", 0, 0, err
	}
	inc, err := e.identIncFrom(owner, conn)
	if err != nil {
		return base.Grant{}, "", 0, 0, err
	}
	e.leaseMu.Lock()
	holder, cur0 := t.holder, t.epoch
	if holder == owner && cur0 == epoch {
		t.holderInc = inc // a renewal: the renewer knows the grant (holderReads)
	}
	e.leaseMu.Unlock()
	if holder == owner && cur0 == epoch {
		g := e.grant(t, owner)
		g.Lease = 0
		return g, "", 0, max(t.grantLSN, 1), nil // 1: durable at once (LSNs start at 1)
	}
	if epoch <= cur0 {
		return base.Grant{}, "", 0, 0, fmt.Errorf("%w: table %q: etcd grant of revision %d is not above the table's %d", ErrFenced, t.name, epoch, cur0)
	}
	if err := e.grantWaitsForTxns(t); err != nil { // before etcd is asked; checked again at the record
		return base.Grant{}, "", 0, 0, err
	}
	parted, _ := clusterTableName(t.name, t.cluster.Partition)
	return base.Grant{}, parted, t.cluster.Partition, 0, nil
}

// waitGrantDurable waits until the WAL is durable through lsn, the record of a grant being
// answered, or ctx ends (ErrGrantUnverified: retry). No lock held.
func (e *Engine) waitGrantDurable(ctx context.Context, lsn uint64) error {
	ch := make(chan error, 1)
	e.ackWhenDurable(lsn, func(_ uint64, err error) { ch <- err })
	select {
	case err := <-ch: // durable already: answered whatever ctx says
		return err
	default:
	}
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return fmt.Errorf("%w: wait for the grant's record to be durable: %w", ErrGrantUnverified, ctx.Err())
	}
}

// grantWaitsForTxns refuses a new grant of t (a new etcd revision: a renewal of the current
// one is answered before) while a prepared transaction writes t, as Acquire does for another
// owner (docs/cluster.md, "The participant"): the new owner would cache the committed
// versions of rows the pending decision may still change. That holds for the same owner too:
// a new grant means a new session (a restarted node, or one that lost its lease), whose cache
// starts empty, and whose later write of such a row would undo a commit applied meanwhile.
// The transaction is resolved by its coordinator or by this node's resolver (the old
// session's lease gone in etcd, its primary records abort); the grant is then registered.
// Caller holds mu.
func (e *Engine) grantWaitsForTxns(t *table) error {
	if e.tableLocked(t.id) {
		return fmt.Errorf("%w: partition table %q has rows of a transaction in doubt: a new grant is registered once it is resolved", ErrTxnLocked, t.name)
	}
	return nil
}

// identFenced refuses an owner that released its identity (ReleaseOwner). Caller holds mu.
func (e *Engine) identFenced(owner uint64) error {
	e.identMu.Lock()
	defer e.identMu.Unlock()
	if id := e.idents[owner]; id != nil && id.released {
		return fmt.Errorf("%w: owner %d released its tables", ErrFenced, owner)
	}
	return nil
}

// verifyGrant runs the GrantVerifier in a slot, the wait for the slot and the verification
// bounded by GrantVerifyTimeout together. No lock held.
func (e *Engine) verifyGrant(ctx context.Context, table string, part uint32, owner, epoch uint64) error {
	return e.verifyGrantFrom(ctx, 0, table, part, owner, epoch)
}

// verifyGrantFrom is verifyGrant for a request of connection conn (0: none), which gets a
// slot at once or is refused (verify_slots.go).
func (e *Engine) verifyGrantFrom(ctx context.Context, conn uint64, table string, part uint32, owner, epoch uint64) error {
	ctx, cancel := context.WithTimeout(ctx, e.opts.GrantVerifyTimeout)
	defer cancel()
	if err := e.takeVerifySlot(ctx, conn); err != nil {
		return err
	}
	defer e.releaseVerifySlot(conn)
	err := e.opts.GrantVerifier.VerifyGrant(ctx, table, part, owner, epoch)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrFenced):
		e.opts.Logger.Warn("storenode: etcd grant refused", "table", table, "partition", part, "owner", owner, "epoch", epoch, "err", err)
		return fmt.Errorf("storenode: table %q partition %d: etcd grant of revision %d refused: %w", table, part, epoch, err)
	default:
		return fmt.Errorf("%w: table %q partition %d revision %d: %w", ErrGrantUnverified, table, part, epoch, err)
	}
}

// clusterAllocIDs is AllocIDs for a cluster table: up to pages pages of ids of the table's
// partition from its next id, within one stripe (a grant is one run of ids). Caller holds mu.
func (t *table) clusterAllocIDs(pages int) (first, count uint64, err error) {
	return t.clusterAllocIDsFrom(t.nextID, pages)
}

// clusterAllocIDsFrom is clusterAllocIDs from the high-water mark next (a replica's leader:
// past the grants proposed, allocIDsProposed).
func (t *table) clusterAllocIDsFrom(next uint64, pages int) (first, count uint64, err error) {
	first, ok := PartitionNextID(t.cluster, next)
	if !ok {
		return 0, 0, fmt.Errorf("%w: table %q has no ids of partition %d left (row ids stop below %d)", ErrMalformed, t.name, t.cluster.Partition, uint64(MaxRowID))
	}
	count = min(uint64(pages)*logicpage.RowsPerPage, layoutStripeEnd(t.cluster, first)-first, MaxRowID-first)
	return first, count, nil
}

// restoreFloor is finishRestore's step for cluster tables: etcd's current revision, read
// before any lock is taken, or 0 when the store has no cluster table.
func (e *Engine) restoreFloor() (uint64, error) {
	e.mu.Lock()
	n := 0
	for _, t := range e.tables {
		if t.cluster.IsCluster() {
			n++
		}
	}
	e.mu.Unlock()
	if n == 0 {
		return 0, nil
	}
	if e.opts.GrantVerifier == nil {
		return 0, fmt.Errorf("%w: the first open of a restored copy holding %d cluster-managed tables needs etcd, to raise their floors to its current revision", ErrNoVerifier, n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.opts.GrantVerifyTimeout)
	defer cancel()
	rev, err := e.opts.GrantVerifier.Revision(ctx)
	if err != nil {
		return 0, fmt.Errorf("%w: the first open of a restored copy needs etcd's current revision: %w", ErrGrantUnverified, err)
	}
	if rev == 0 {
		return 0, fmt.Errorf("%w: etcd reported revision 0", ErrGrantUnverified)
	}
	return rev, nil
}
