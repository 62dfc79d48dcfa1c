package storenode

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/weftdb/weft/bitmaptree"
	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/logicpage"
	"github.com/weftdb/weft/storenode/wal"
)

// Recovery, in the order DESIGN.md gives: lock the directory; load the published meta
// (catalog, grants, dedup table, page maps, checkpoint LSN); open the data files and rebuild
// the bitmap-trees (rows present, disk pages in use) from the page maps; replay the WAL after
// the checkpoint LSN (table creations and drops, id and ownership grants, commit batches into
// partial cache frames, owners' seqs), after a replica's checkpoint's transaction state
// sidecar (txnstate.go); remove data files no table owns and sidecars the meta does not name.
//
// Replay may produce more dirty pages than the cache holds; then it checkpoints between two
// records (never inside one), so recovery keeps the cache's memory bound. The WAL replays only
// after its own recovery made the log durable as read (it rewrites and syncs the records that
// may be in the OS page cache only, e.g. after a failed fsync), so such a checkpoint never
// publishes a record that a power loss could still take back.

func (e *Engine) recover() error {
	if err := e.fs.MkdirAll(e.dir); err != nil {
		return fmt.Errorf("storenode: open %s: %w", e.dir, err)
	}
	lock, err := e.fs.Lock(path.Join(e.dir, "LOCK"))
	if err != nil {
		switch {
		case errors.Is(err, vfs.ErrLockedInProcess):
			return fmt.Errorf("%w: %s", ErrAlreadyOpen, e.dir)
		case errors.Is(err, vfs.ErrLocked):
			return fmt.Errorf("%w: %s: %w", ErrLocked, e.dir, err)
		}
		return fmt.Errorf("storenode: lock %s: %w", e.dir, err)
	}
	e.lock = lock

	m, ok, err := loadMeta(e.fs, e.dir)
	if err != nil {
		return err
	}
	if !ok {
		if names, _ := e.fs.List(walDir(e.dir)); hasWALSegments(names) {
			return corrupt.Errorf("storenode: %s: the meta file is missing but the WAL holds records", e.dir)
		}
		// Without a meta file every data file is an orphan, and removeOrphans would delete
		// the rows of a store whose meta file alone was lost.
		names, err := e.fs.List(e.dir)
		if err != nil {
			return fmt.Errorf("storenode: list %s: %w", e.dir, err)
		}
		if files := dataFiles(names); len(files) > 0 {
			return corrupt.Errorf("storenode: %s: the meta file is missing but data files exist (%s)", e.dir, strings.Join(files, ", "))
		}
		m = &metaState{nextTable: 1, owners: make(map[uint64]ownerState)}
		if err := publishMeta(e.fs, e.dir, m); err != nil {
			return err
		}
	}
	if err := e.openMapLog(m); err != nil {
		return err
	}
	e.ckptLSN, e.lastLSN, e.nextTable = m.ckptLSN, m.ckptLSN, m.nextTable
	e.recoveredSynced = m.syncedLSN
	for _, mt := range m.tables {
		if err := e.loadTable(&mt); err != nil {
			return err
		}
	}
	now := e.opts.Now()
	for id, o := range m.owners {
		o.active = now
		e.owners[id] = &o
	}

	e.replaying = true
	if m.txnState != 0 && !e.replicated() {
		e.replaying = false
		return fmt.Errorf("storenode: open %s: a replica's store (meta version 6, %s): its log is the group's, open it with Options.Proposer",
			e.dir, txnStateName(m.txnState))
	}
	if m.txnState != 0 {
		// A replica's checkpoint: its transaction and move states (txnstate.go).
		e.repl.txnStates = append(e.repl.txnStates[:0], m.txnState)
		if err := e.loadTxnState(m.txnState); err != nil {
			e.replaying = false
			return err
		}
	}
	after, durable, replay := e.ckptLSN, m.syncedLSN, e.replayRecord
	if e.replicated() {
		// A replica appends no engine record to its WAL (its records are the group's log,
		// which re-delivers the entries after the checkpoint index: docs/replication.md 1.4),
		// so the WAL holds none, whatever the meta's index; one that does is a standalone
		// store's, which a replica cannot take over this way.
		after, durable, replay = 0, 0, e.replayOnReplica
	}
	log, err := wal.Open(e.fs, walDir(e.dir), wal.Options{
		Sync:           wal.SyncMode(e.opts.Sync),
		Gather:         e.opts.WALGather,
		SegmentBytes:   e.opts.WALSegmentBytes,
		MaxQueueBytes:  64 << 20,
		MaxRecordBytes: walRecordBytesMax,
		After:          after,
		DurableThrough: durable,
		SyncLatency:    &e.lat.walSync,
	}, replay)
	e.replaying = false
	if err == nil {
		e.noteTxnReplayed()
	}
	if len(e.txnForgot) >= min(e.opts.MaxTxns, e.opts.TxnForgetMax) {
		// The checkpoint carried as many forgotten decisions as it may: older ones may have
		// been left behind (carryTxns), as a count eviction gives them way.
		e.txnForgotLost = e.opts.Now()
	}
	if e.replayForce {
		e.replayForce = false
		e.requestCheckpoint() // carry the transactions and clean the cache
	}
	for id, o := range e.owners {
		e.leaseSeqs[id] = o.lastSeq // alone: the engine is not shared yet
	}
	if err != nil {
		return fmt.Errorf("storenode: open %s: %w", e.dir, err)
	}
	e.log = log
	// The WAL directory (and the store's own, if Open made it) are entries of their parents:
	// make them durable before the first record is acknowledged.
	if err := e.fs.SyncDir(e.dir); err != nil {
		return fmt.Errorf("storenode: open %s: sync dir: %w", e.dir, err)
	}
	if err := e.fs.SyncDir(path.Dir(path.Clean(e.dir))); err != nil {
		return fmt.Errorf("storenode: open %s: sync parent dir: %w", e.dir, err)
	}
	if got := log.LastLSN(); got != e.lastLSN && !e.replicated() {
		return corrupt.Errorf("storenode: %s: WAL ends at LSN %d, replay reached %d", e.dir, got, e.lastLSN)
	}
	e.durableLSN = e.lastLSN
	e.durableAt.Store(e.lastLSN)
	return e.removeOrphans()
}

// dataFiles returns the names of names that are data files (table-N.dat).
func dataFiles(names []string) []string {
	var out []string
	for _, n := range names {
		if idText, ok := strings.CutPrefix(n, "table-"); ok {
			if idText, ok = strings.CutSuffix(idText, ".dat"); ok {
				if _, err := strconv.ParseUint(idText, 10, 32); err == nil {
					out = append(out, n)
				}
			}
		}
	}
	return out
}

func hasWALSegments(names []string) bool {
	for _, n := range names {
		if strings.HasSuffix(n, ".log") {
			return true
		}
	}
	return false
}

// loadTable rebuilds a table from its meta entry: data file, rows tree, used disk pages.
func (e *Engine) loadTable(mt *metaTable) error {
	geo, err := logicpage.NewGeometry(mt.rowBytes)
	if err != nil {
		return corrupt.Errorf("storenode: meta: table %d: %w", mt.id, err)
	}
	name := dataFileName(e.dir, mt.id)
	f, err := e.fs.Open(name)
	if err != nil {
		if !isNotExist(err) {
			return fmt.Errorf("storenode: open %s: %w", name, err)
		}
		for _, ent := range mt.pages.all() {
			if ent.disk != 0 {
				return corrupt.Errorf("storenode: %s is missing but the page map refers to it", name)
			}
		}
		if f, err = e.fs.Create(name); err != nil {
			return fmt.Errorf("storenode: create %s: %w", name, err)
		}
	}
	t := &table{id: mt.id, name: mt.name, geo: geo, cluster: mt.cluster, nextID: mt.nextID, holder: mt.holder, epoch: mt.epoch, data: f}
	t.rows, t.used = bitmaptree.New(), bitmaptree.New()
	t.pages = mt.pages
	if t.holder != 0 && !e.opts.ExpireLeasesAtOpen && !t.cluster.IsCluster() {
		t.leaseUntil, t.leaseAtOpen = e.opts.Now().Add(e.opts.LeaseDuration), true
	}
	e.tables[t.id] = t
	e.byName[t.name] = t
	for page, ent := range mt.pages.all() {
		if ent.disk == 0 {
			if ent.present != 0 {
				return corrupt.Errorf("storenode: meta: table %d page %d has rows but no disk page", t.id, page)
			}
			continue
		}
		if t.used.Test(uint64(ent.disk - 1)) {
			return corrupt.Errorf("storenode: meta: table %d: disk page %d mapped twice", t.id, ent.disk-1)
		}
		t.used.Set(uint64(ent.disk - 1))
		t.rows.SetWord(page, ent.present) // a page's present mask is one leaf word
	}
	return nil
}

// replayRecord applies one WAL record during recovery (applyRecord, applyrec.go).
func (e *Engine) replayRecord(rec wal.Record) error {
	if rec.LSN != e.lastLSN+1 {
		return corrupt.Errorf("storenode: replay: record %d after %d", rec.LSN, e.lastLSN)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.applyRecord(rec.Kind, rec.Payload, rec.LSN); err != nil {
		return err
	}
	e.lastLSN = rec.LSN
	return nil
}

// replayOnReplica refuses a WAL record found at a replica's Open: the engine of a replica
// writes none (recover).
func (e *Engine) replayOnReplica(rec wal.Record) error {
	return fmt.Errorf("%w: the WAL of a replica (Options.Proposer set) holds record %d of kind %d: "+
		"a standalone store, or one of a build before replicas kept their log apart, cannot be opened as a replica",
		ErrNotReplicated, rec.LSN, rec.Kind)
}

// removeOrphans deletes data files that no table owns (a table dropped and checkpointed, or
// created and lost with an unsynced WAL tail).
func (e *Engine) removeOrphans() error {
	names, err := e.fs.List(e.dir)
	if err != nil {
		return fmt.Errorf("storenode: list %s: %w", e.dir, err)
	}
	for _, n := range names {
		if index, ok := parseTxnStateName(n); ok && !slices.Contains(e.repl.txnStates, index) {
			// A sidecar the meta file does not name: an older checkpoint's not removed, or
			// one of a checkpoint that did not publish.
			if err := e.fs.Remove(path.Join(e.dir, n)); err != nil {
				return fmt.Errorf("storenode: remove old transaction state %s: %w", n, err)
			}
			continue
		}
		idText, ok := strings.CutPrefix(n, "table-")
		if !ok {
			continue
		}
		idText, ok = strings.CutSuffix(idText, ".dat")
		id, err := strconv.ParseUint(idText, 10, 32)
		if !ok || err != nil || e.tablesByIDAll(uint32(id)) != nil {
			continue
		}
		if err := e.fs.Remove(path.Join(e.dir, n)); err != nil {
			return fmt.Errorf("storenode: remove orphan %s: %w", n, err)
		}
	}
	return nil
}
