package storenode

import (
	"fmt"
	"slices"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/bitmaptree"
	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/logicpage"
)

// The catalog: tables by id and name. Ids are never reused, not even after a drop. A table's
// creation and drop are WAL records synced before the call returns, and every checkpoint
// writes the whole catalog into the meta file.

// CreateTable creates a table of rows of rowBytes bytes (8..4096, a multiple of 8).
func (e *Engine) CreateTable(name string, rowBytes int) (base.TableInfo, error) {
	return e.createTable(name, rowBytes, base.ClusterLayout{}, 0, false)
}

// CreateTableAs is CreateTable on behalf of owner (a client's session): it fails with
// ErrTooManyTables when owner has Options.MaxTablesPerOwner tables here (ownerTables).
func (e *Engine) CreateTableAs(name string, rowBytes int, owner uint64) (base.TableInfo, error) {
	return e.createTable(name, rowBytes, base.ClusterLayout{}, owner, true)
}

// ownerTables counts the tables that are owner's for MaxTablesPerOwner: those whose holder
// (or last holder) is owner, and those owner created since Open that no owner was granted
// yet; dropped ones included until a checkpoint removes their files. Caller holds mu.
func (e *Engine) ownerTables(owner uint64) int {
	n := 0
	for _, t := range e.tables {
		if t.holder == owner && owner != 0 || t.holder == 0 && t.createdAs && t.creator == owner {
			n++
		}
	}
	for _, t := range e.dropped {
		if t.holder == owner && owner != 0 || t.holder == 0 && t.createdAs && t.creator == owner {
			n++
		}
	}
	return n
}

// createTable creates a local table (cl zero) or a cluster-managed one (CreateClusterTable),
// on behalf of owner when as is set (CreateTableAs: MaxTablesPerOwner).
func (e *Engine) createTable(name string, rowBytes int, cl base.ClusterLayout, owner uint64, as bool) (base.TableInfo, error) {
	if err := checkName(name); err != nil {
		return base.TableInfo{}, fmt.Errorf("%w: %q", err, name)
	}
	geo, err := logicpage.NewGeometry(rowBytes)
	if err != nil {
		return base.TableInfo{}, fmt.Errorf("%w: %w", ErrRowSize, err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.usable(); err != nil {
		return base.TableInfo{}, err
	}
	if err := e.checkLeader(); err != nil {
		return base.TableInfo{}, err
	}
	if _, ok := e.byName[name]; ok {
		return base.TableInfo{}, fmt.Errorf("%w: %q", ErrTableExists, name)
	}
	if n := len(e.tables) + len(e.dropped); n >= e.opts.MaxTables {
		return base.TableInfo{}, fmt.Errorf("%w: %d tables (dropped ones count until a checkpoint removes their files), the limit is %d",
			ErrTooManyTables, n, e.opts.MaxTables)
	}
	if as {
		if n := e.ownerTables(owner); n >= e.opts.MaxTablesPerOwner {
			return base.TableInfo{}, fmt.Errorf("%w: owner %d has %d tables here (held, or created and not yet granted; dropped ones count until a checkpoint), the limit per owner is %d",
				ErrTooManyTables, owner, n, e.opts.MaxTablesPerOwner)
		}
	}
	if e.opts.Proposer != nil {
		return e.createTableProposed(name, rowBytes, cl, owner, as)
	}
	id := e.nextTable
	if id == tableIDNone {
		return base.TableInfo{}, fmt.Errorf("%w: every table id has been used", ErrTooManyTables)
	}
	// The data file first: if it cannot be made (no file descriptor left, say) the request
	// fails and nothing was logged. A file left by a record that then fails is an orphan,
	// removed by the next Open.
	f, err := e.fs.Create(dataFileName(e.dir, id))
	if err != nil {
		if isFileLimit(err) {
			return base.TableInfo{}, fmt.Errorf("%w: create table %q: %w", ErrTooManyTables, name, err)
		}
		return base.TableInfo{}, fmt.Errorf("storenode: create table %q: %w", name, err)
	}
	kind := kindCreateTable
	e.scratch = appendCreateRecord(e.scratch[:0], id, rowBytes, name)
	if cl.IsCluster() {
		kind = kindCreateClusterTable
		e.scratch = appendCreateClusterRecord(e.scratch[:0], id, rowBytes, name, cl)
	}
	ch := make(chan error, 1)
	if _, err := e.appendRecord(kind, e.scratch, true, func(_ uint64, err error) { ch <- err }); err != nil {
		f.Close()
		return base.TableInfo{}, err
	}
	t := e.applyCreateTable(id, name, geo, cl, f) // id is nextTable: it becomes id+1
	t.creator, t.createdAs = owner, as
	e.mu.Unlock()
	err = <-ch
	e.mu.Lock()
	if err != nil {
		return base.TableInfo{}, err
	}
	return t.info(), nil
}

// registerTable adds a table whose data file f is open. Caller holds mu.
// A cluster table's layout (cl) is set before the table is published: renewals read it
// under leaseMu alone.
func (e *Engine) registerTable(id uint32, name string, geo logicpage.Geometry, f vfs.File, cl base.ClusterLayout) *table {
	t := &table{id: id, name: name, geo: geo, rows: bitmaptree.New(), used: bitmaptree.New(), data: f}
	t.setCluster(cl)
	e.leaseMu.Lock() // lease renewals find tables under it alone
	e.tables[id] = t
	e.leaseMu.Unlock()
	e.byName[name] = t
	return t
}

// setCluster makes t a cluster-managed table of layout cl (nothing for a zero cl): its next
// id is its partition's first. Before t is published (registerTable).
func (t *table) setCluster(cl base.ClusterLayout) {
	if !cl.IsCluster() {
		return
	}
	t.cluster = cl
	if first, ok := PartitionNextID(cl, t.nextID); ok {
		t.nextID = first
	}
}

// OpenTable returns the table's description.
func (e *Engine) OpenTable(name string) (base.TableInfo, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return base.TableInfo{}, ErrClosed
	}
	t, ok := e.byName[name]
	if !ok {
		return base.TableInfo{}, fmt.Errorf("%w: %q", ErrTableNotFound, name)
	}
	return t.info(), nil
}

// Tables lists every table, by id.
func (e *Engine) Tables() []base.TableInfo {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]base.TableInfo, 0, len(e.tables))
	for _, t := range e.tables {
		out = append(out, t.info())
	}
	slices.SortFunc(out, func(a, b base.TableInfo) int { return int(a.ID) - int(b.ID) })
	return out
}

// DropTable deletes a table and all its rows on behalf of owner: the table's holder, or anyone
// when no other owner's lease is live (ErrTableOwned otherwise). Its id is not reused; its
// data file is removed once a checkpoint no longer lists it. A cluster-managed table has no
// lease here: its registered holder drops it while etcd says its grant is current, anyone
// (the holder too, once its grant lapsed; anyone when no holder is registered, as on a
// restored copy) only once etcd's partition map no longer has it (verifyClusterDrop:
// ErrTableOwned while mapped, ErrGrantUnverified when etcd does not answer), so a drop waits
// for etcd, with no lock held: any goroutine but an event loop. A move's retired copy is
// anyone's to drop, unless etcd's map places its partition on this node (verifyRetiredDrop).
// A storage node with no GrantVerifier (no etcd: no grant can be registered) drops a
// cluster table as a local one. An operator drops a cluster table the map does not place
// here with DropMisplacedTable.
func (e *Engine) DropTable(name string, owner uint64) error {
	return e.dropTable(name, owner, nil)
}

// dropTable is DropTable; misplaced, when not nil, is the table DropMisplacedTable found
// etcd's map does not place here (no move state, no move of it recorded): dropped as a
// retired copy is, if it is still name's and still has no move state.
func (e *Engine) dropTable(name string, owner uint64, misplaced *table) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.usable(); err != nil {
		return err
	}
	if err := e.checkLeader(); err != nil {
		return err
	}
	t, ok := e.byName[name]
	if !ok {
		return fmt.Errorf("%w: %q", ErrTableNotFound, name)
	}
	if misplaced != nil && (t != misplaced || e.moveOf(t) != nil) {
		return fmt.Errorf("%w: cluster table %q changed while the drop asked etcd", ErrTableOwned, name)
	}
	// A retired copy of a move serves nothing and never will: anyone drops it (unless the
	// map places it here, below). An incoming copy is not one: from the switch until its
	// activation it is the copy the map points at (the only one that will serve the
	// partition), and this node cannot tell whether the switch happened, so it is dropped
	// as any cluster table (once the map has no such table); a move rolled back leaves it
	// for the next move, which reuses it.
	moveCopy := e.moves != nil && stateOf(e.moveOf(t)) == MoveRetired
	if moveCopy && e.opts.GrantVerifier != nil {
		// Unless etcd's map places it here (a retire of before the steps were verified):
		// asked with no lock held (move_verify.go).
		e.mu.Unlock()
		err := e.verifyRetiredDrop(t)
		e.mu.Lock()
		if err != nil {
			return err
		}
		if err := e.usable(); err != nil {
			return err
		}
		if e.byName[name] != t {
			return fmt.Errorf("%w: %q", ErrTableNotFound, name)
		}
		moveCopy = stateOf(e.moveOf(t)) == MoveRetired
	}
	if t.cluster.IsCluster() && e.opts.GrantVerifier != nil && !moveCopy && misplaced == nil {
		// A cluster table has no lease here (its grants are etcd's): its registered holder
		// drops it while its etcd grant is current, anyone once etcd's map no longer has
		// the table. etcd is asked with no lock held; a grant registered meanwhile (the
		// holder or its epoch changed) refuses the drop.
		e.leaseMu.Lock()
		holder, epoch := t.holder, t.epoch
		e.leaseMu.Unlock()
		e.mu.Unlock()
		err := e.verifyClusterDrop(t, owner, holder, epoch)
		e.mu.Lock()
		if err != nil {
			return err
		}
		if err := e.usable(); err != nil {
			return err
		}
		if e.byName[name] != t {
			return fmt.Errorf("%w: %q", ErrTableNotFound, name)
		}
		e.leaseMu.Lock()
		changed := t.holder != holder || t.epoch != epoch
		e.leaseMu.Unlock()
		if changed {
			return fmt.Errorf("%w: cluster table %q: a grant was registered while the drop asked etcd", ErrTableOwned, name)
		}
	}
	if e.tableLocked(t.id) {
		return fmt.Errorf("%w: table %q has rows of a prepared transaction", ErrTxnLocked, name)
	}
	// The check and the mark under one leaseMu: a renewal (which takes no mu) after it is
	// refused, so no holder is told its lease is live while the table goes.
	e.leaseMu.Lock()
	live := e.liveHolder(t, owner) && !moveCopy && misplaced == nil
	t.dropping = !live
	e.leaseMu.Unlock()
	if live {
		return fmt.Errorf("%w: table %q: drop it from the node that holds it, or after its lease ends", ErrTableOwned, name)
	}
	e.scratch = appendDropRecord(e.scratch[:0], t.id)
	if e.opts.Proposer != nil {
		return e.dropTableProposed(t, e.scratch)
	}
	ch := make(chan error, 1)
	lsn, err := e.appendRecord(kindDropTable, e.scratch, true, func(_ uint64, err error) { ch <- err })
	if err != nil {
		e.leaseMu.Lock()
		t.dropping = false
		e.leaseMu.Unlock()
		return err
	}
	e.applyDropTable(t, lsn)
	e.mu.Unlock()
	err = <-ch
	e.mu.Lock()
	return err
}

// removeTable unlinks a table from the catalog and the cache. Caller holds mu.
func (e *Engine) removeTable(t *table) {
	e.leaseMu.Lock()
	delete(e.tables, t.id)
	e.leaseMu.Unlock()
	delete(e.byName, t.name)
	if delete(e.moves, t.id); len(e.moves) == 0 {
		e.moves = nil
	}
	t.dropped = true
	for _, id := range e.cache.index.tableFrames(t.id, nil) {
		e.cache.drop(id)
	}
	e.dropped = append(e.dropped, t)
}
