package storenode

import (
	"errors"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/weftdb/weft/internal/checksum"
)

// Checkpoint. The checkpoint LSN is taken when the snapshot starts, with the catalog, grants
// and dedup table as of that LSN. Each dirty page is then copied with its LSN under mu (commits
// keep flowing between pages; a partial frame is first merged with its disk copy) and written
// to a FREE disk page, never over the page's only durable copy. Then: fsync the data files and
// the directory, sync the WAL through everything copied (a copied page may hold batches after
// the checkpoint LSN; recovery replays them whole from the WAL), publish the new page map and
// LSN in the meta file atomically, and only then free the old disk pages, mark the copied
// frames clean (unless written again since) and drop WAL segments wholly below the LSN.
//
// Any IO error in a checkpoint makes the engine fail-stop: nothing was published, the WAL still
// holds everything, and a reopen recovers.

type ckptWrite struct {
	t     *table
	page  uint64
	frame int32
	key   uint64
	ent   mapEntry
}

// Checkpoint writes every dirty page and publishes a new checkpoint now. Background
// checkpoints run by WAL growth, time and cache pressure (Options).
func (e *Engine) Checkpoint() error {
	e.mu.Lock()
	err := e.usable()
	e.mu.Unlock()
	if err != nil {
		return err
	}
	return e.checkpoint(false)
}

func (e *Engine) checkpointLoop() {
	defer e.bg.Done()
	var tick <-chan time.Time
	if e.opts.CheckpointInterval > 0 {
		t := time.NewTicker(e.opts.CheckpointInterval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-e.stop:
			return
		case <-e.ckptReq:
		case <-tick:
		}
		if err := e.checkpoint(false); err != nil && !errors.Is(err, ErrClosed) && !errors.Is(err, ErrFailStop) {
			e.opts.Logger.Error("storenode: checkpoint", "err", err)
		}
	}
}

// requestCheckpoint asks the background loop for a checkpoint; it never blocks.
func (e *Engine) requestCheckpoint() {
	select {
	case e.ckptReq <- struct{}{}:
	default:
	}
}

func (e *Engine) walPressure() bool {
	return e.opts.CheckpointWALBytes > 0 && int64(e.stats.walBytes.Load()-e.walBytesAtCkpt) > e.opts.CheckpointWALBytes
}

// checkpoint runs one checkpoint. In replay (inside recovery, before the WAL is open for
// appends) it syncs the WAL's files directly and leaves the WAL's segments alone. Its steps, in
// order (each one's rule is in the file doc): snapshot, write the dirty pages to free disk pages,
// sync the data files and the WAL, publish the new meta file, then install the new page maps and
// release what the old checkpoint held.
func (e *Engine) checkpoint(replay bool) (err error) {
	e.ckptMu.Lock()
	defer e.ckptMu.Unlock()
	start := time.Now()

	snap, todo, err := e.beginCheckpoint()
	if err != nil || snap == nil {
		return err
	}
	defer func() {
		if err != nil {
			err = e.fail(err)
			e.broadcastFailure()
		}
	}()

	written, touched, err := e.writeDirtyPages(todo)
	if err != nil {
		return err
	}
	if err := e.syncDataFiles(touched); err != nil {
		return err
	}
	acked, err := e.syncWALForCheckpoint(snap.ckptLSN, replay)
	if err != nil {
		return err
	}
	newPages, old := e.patchPageMaps(snap, written)
	// Everything the WAL acknowledged is durable, and it has been synced through every record
	// the snapshot copied: a bad record up to here is corruption at the next recovery.
	snap.syncedLSN = acked
	if err := publishMeta(e.fs, e.dir, snap); err != nil {
		return err
	}
	gone, keepFrom := e.installCheckpoint(snap.ckptLSN, newPages, written, old)
	e.removeDroppedFiles(gone)
	if !replay {
		if err := e.log.DropBefore(keepFrom + 1); err != nil {
			return fmt.Errorf("storenode: checkpoint: drop WAL segments: %w", err)
		}
	}
	e.stats.noteCheckpoint(time.Since(start), len(written))
	e.opts.Logger.Debug("storenode: checkpoint", "lsn", snap.ckptLSN, "pages", len(written), "took", time.Since(start))
	return nil
}

// beginCheckpoint takes the checkpoint's snapshot (catalog, grants and dedup table as of the
// checkpoint LSN) and the list of dirty pages, under mu. It returns a nil snapshot and no
// error when nothing was logged since the last checkpoint (waiters on ckptGen are woken), and
// the engine's failure, unwrapped, when it is failed or closed.
func (e *Engine) beginCheckpoint() (*metaState, []ckptWrite, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.failure(); err != nil {
		return nil, nil, err
	}
	if e.lastLSN == e.ckptLSN {
		e.ckptGen++
		e.cond.Broadcast()
		return nil, nil, nil
	}
	snap := e.snapshotMeta()
	e.walBytesAtCkpt = e.stats.walBytes.Load()
	var todo []ckptWrite
	for key, id := range e.cache.index {
		if e.cache.frames[id].dirty {
			t := e.tables[uint32(key>>32)]
			todo = append(todo, ckptWrite{t: t, page: key & (1<<32 - 1), frame: id, key: key})
		}
	}
	return snap, todo, nil
}

// writeDirtyPages copies and writes each page of todo to a free disk page (copyAndWrite; commits
// keep flowing between pages). It returns the writes done, reusing todo's array, and the tables
// whose data files they touched.
func (e *Engine) writeDirtyPages(todo []ckptWrite) ([]ckptWrite, map[*table]bool, error) {
	written := todo[:0]
	touched := make(map[*table]bool)
	for _, w := range todo {
		ok, err := e.copyAndWrite(&w)
		if err != nil {
			return nil, nil, err
		}
		if ok {
			written = append(written, w)
			touched[w.t] = true
		}
	}
	return written, touched, nil
}

// syncDataFiles fsyncs the data files the checkpoint wrote, then the directory.
func (e *Engine) syncDataFiles(touched map[*table]bool) error {
	for t := range touched {
		if err := t.data.Sync(); err != nil {
			return fmt.Errorf("storenode: checkpoint: sync %s: %w", dataFileName(e.dir, t.id), err)
		}
	}
	if err := e.fs.SyncDir(e.dir); err != nil {
		return fmt.Errorf("storenode: checkpoint: sync dir: %w", err)
	}
	return nil
}

// syncWALForCheckpoint syncs the WAL through every record a copied page may hold (pages are
// copied after the checkpoint LSN was taken) and returns the LSN through which the WAL is
// known durable: the new meta file's synced LSN.
func (e *Engine) syncWALForCheckpoint(ckptLSN uint64, replay bool) (uint64, error) {
	// Every record acknowledged before the WAL sync below was written (SyncNone) or synced;
	// after the sync all of them are durable.
	acked := ckptLSN
	var err error
	if replay {
		// The WAL's recovery made the whole log durable before replay, and the previous
		// meta file proved its synced LSN: keep it, or a bad record below it would pass
		// for a torn tail at the next recovery.
		acked = max(acked, e.recoveredSynced)
		err = e.syncWALFiles()
	} else {
		acked = max(acked, e.durableThrough())
		err = e.log.Sync()
	}
	if err != nil {
		return 0, fmt.Errorf("storenode: checkpoint: sync WAL: %w", err)
	}
	return acked, nil
}

// patchPageMaps builds the new page maps, versions of the published ones with the written
// entries set (path copying: the cost is the written pages', not the maps'), and puts them in
// snap. It returns them by table id, with the entries they replaced in old[i] for written[i].
// Only checkpoints (under ckptMu) replace a live table's map, so the maps read here stay
// the published ones; the lock is held only to read the table pointers' fields.
func (e *Engine) patchPageMaps(snap *metaState, written []ckptWrite) (newPages map[uint32]*pageMap, old []mapEntry) {
	newPages = make(map[uint32]*pageMap)
	old = make([]mapEntry, len(written))
	for i, w := range written {
		pm, ok := newPages[w.t.id]
		if !ok {
			e.mu.Lock()
			pm = w.t.pages.edit()
			e.mu.Unlock()
			newPages[w.t.id] = pm
		}
		old[i] = pm.get(w.page)
		pm.set(w.page, w.ent)
	}
	for _, pm := range newPages {
		pm.seal()
	}
	for i := range snap.tables {
		st := &snap.tables[i]
		if pm, ok := newPages[st.id]; ok {
			st.pages = pm
		}
	}
	return newPages, old
}

// installCheckpoint runs after the meta file is published: it installs the new page maps,
// frees the disk pages they replaced, marks the copied frames clean (unless written again
// since), advances ckptLSN and wakes its waiters. It returns the dropped tables the checkpoint
// made removable and the LSN whose WAL records must be kept from: ckptLSN, or the oldest
// checkpoint a backup holds. While a backup holds a snapshot, replaced disk pages are kept
// from reuse (heldPages) and no data file is removed (backup.go).
func (e *Engine) installCheckpoint(ckptLSN uint64, newPages map[uint32]*pageMap, written []ckptWrite, old []mapEntry) (gone []*table, keepFrom uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	held := len(e.backups) > 0 // under mu: a release frees heldPages under it
	for id, pm := range newPages {
		if t := e.tablesByIDAll(id); t != nil {
			t.io.Lock()
			t.pages = pm
			t.io.Unlock()
		}
	}
	// The replaced copies: each written page's old entry (a page is written once per
	// checkpoint), freed now that no published map refers to it.
	for i, w := range written {
		if ent := old[i]; ent.disk != 0 && ent.disk != w.ent.disk && e.tablesByIDAll(w.t.id) == w.t {
			if held {
				e.heldPages = append(e.heldPages, heldPage{t: w.t, disk: ent.disk, since: ckptLSN})
			} else {
				w.t.used.Clear(uint64(ent.disk - 1))
			}
		}
	}
	for _, w := range written {
		if id, ok := e.cache.lookup(w.key); ok && id == w.frame {
			if f := &e.cache.frames[id]; f.lsn == f.copied {
				e.cache.markClean(id)
			}
		}
	}
	e.ckptLSN = ckptLSN
	e.ckptGen++
	keep := e.dropped[:0]
	for _, t := range e.dropped {
		if t.dropLSN <= ckptLSN && !e.heldBefore(t.dropLSN) {
			gone = append(gone, t)
		} else {
			keep = append(keep, t)
		}
	}
	e.dropped = keep
	e.cond.Broadcast()
	return gone, e.holdFloor(ckptLSN)
}

// removeDroppedFiles closes and removes the data files of dropped tables no checkpoint or
// recovery needs any more. A failed remove is logged: the file is garbage, not state.
func (e *Engine) removeDroppedFiles(gone []*table) {
	for _, t := range gone {
		t.data.Close()
		if err := e.fs.Remove(dataFileName(e.dir, t.id)); err != nil && !isNotExist(err) {
			e.opts.Logger.Warn("storenode: remove data file of dropped table", "table", t.name, "err", err)
		}
	}
}

// tablesByIDAll finds a table, live or dropped but not yet removed. Caller holds mu.
func (e *Engine) tablesByIDAll(id uint32) *table {
	if t, ok := e.tables[id]; ok {
		return t
	}
	for _, t := range e.dropped {
		if t.id == id {
			return t
		}
	}
	return nil
}

// copyAndWrite copies one dirty page (merging a partial frame with its disk copy first) and
// writes it to a free disk page. It reports false when the page no longer needs writing (its
// table was dropped).
func (e *Engine) copyAndWrite(w *ckptWrite) (bool, error) {
	e.mu.Lock()
	id, ok := e.cache.lookup(w.key)
	if !ok || id != w.frame || w.t.dropped {
		e.mu.Unlock()
		return false, nil
	}
	if e.cache.frames[id].valid != ^uint64(0) {
		if err := e.loadFrame(w.t, w.page, id); err != nil {
			e.mu.Unlock()
			if w.t.dropped {
				return false, nil
			}
			return false, err
		}
	}
	size := w.t.geo.DiskPageBytes()
	buf := getDiskPage(size)
	n := copy(*buf, e.cache.rows(id))
	clear((*buf)[n:])
	f := &e.cache.frames[id]
	f.copied = f.lsn
	w.ent.lsn = f.lsn
	w.ent.present = w.t.presentWord(w.page)
	d, _ := w.t.used.NextClear(0)
	w.t.used.Set(d)
	w.ent.disk = uint32(d + 1)
	e.mu.Unlock()

	w.ent.crc = checksum.Of(*buf)
	_, err := w.t.data.WriteAt(*buf, int64(d)*int64(size))
	diskPagePool.Put(buf)
	if err != nil {
		return false, fmt.Errorf("storenode: checkpoint: write %s disk page %d: %w", dataFileName(e.dir, w.t.id), d, err)
	}
	e.stats.diskWrites.Add(1)
	return true, nil
}

// snapshotMeta captures the catalog, grants and dedup table at e.lastLSN. Caller holds mu.
func (e *Engine) snapshotMeta() *metaState {
	m := &metaState{ckptLSN: e.lastLSN, nextTable: e.nextTable, owners: make(map[uint64]ownerState, len(e.owners))}
	for _, id := range sortedTableIDs(e.tables) {
		t := e.tables[id]
		m.tables = append(m.tables, metaTable{
			id: t.id, rowBytes: t.geo.RowBytes(), name: t.name, nextID: t.nextID,
			holder: t.holder, epoch: t.epoch, pages: t.pages,
		})
	}
	e.expireOwners()
	for id, o := range e.owners {
		m.owners[id] = o.clone()
	}
	return m
}

// syncWALFiles fsyncs every WAL segment: a checkpoint taken during replay must not publish
// records that a power loss could still take away from the WAL.
func (e *Engine) syncWALFiles() error {
	dir := walDir(e.dir)
	names, err := e.fs.List(dir)
	if err != nil {
		if isNotExist(err) {
			return nil
		}
		return err
	}
	for _, name := range names {
		if !strings.HasSuffix(name, ".log") {
			continue
		}
		f, err := e.fs.Open(path.Join(dir, name))
		if err != nil {
			return err
		}
		err = f.Sync()
		f.Close()
		if err != nil {
			return err
		}
	}
	return nil
}
