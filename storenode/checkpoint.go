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
// the checkpoint LSN; recovery replays them whole from the WAL) and through the drop record of
// any table dropped since the snapshot (its skipped pages are not in the meta file, which
// still lists the table), publish the new page map and
// LSN in the meta file atomically, and only then free the old disk pages, mark the copied
// frames clean (unless written again since) and drop WAL segments wholly below the LSN.
//
// A replica's checkpoint (Options.Proposer set) carries no record after its LSN: it writes its
// transaction and move states to the sidecar txnstate-<LSN> (txnstate.go), fsynced before any
// page is written, its directory entry by the data files' directory fsync, and names it in the
// meta file (version 6); the older sidecars go once that meta file is published.
//
// Any IO error in a checkpoint makes the engine fail-stop: nothing was published, the WAL still
// holds everything, and a reopen recovers. Except a want of file descriptors before the meta
// file's rename: that checkpoint is abandoned and tried again later (ckpt_defer.go).
//
// Lock holds. Commits take mu, so no step of a checkpoint holds it for longer than a bounded
// chunk of work: the scan for dirty frames takes ckptScanFrames frames per hold; the copy
// takes up to ckptCopyBytes of pages per hold (a partial frame's disk read releases mu, as
// every load does) and writes them after releasing it; the new page maps are built by path
// copying with no lock (only checkpoints replace a live table's map, one at a time under
// ckptMu) and installed under mu in O(tables); the old copies are freed and the frames marked
// clean ckptInstallWrites at a time. The WAL is made durable through the copied pages without
// holding up its writer: the checkpoint waits until the WAL has acknowledged every record the
// copies and the snapshot hold (written, or synced under SyncAlways), then, under SyncNone,
// fsyncs the segment files and the WAL directory itself.

type ckptWrite struct {
	t     *table
	page  uint64
	frame int32
	key   uint64
	ent   mapEntry
	off   int // of its copy in the chunk buffer; -1 when it needs no writing (table dropped)
}

// ckptChunks are the bounds of one lock hold of a checkpoint, set at Open from the constants
// below; tests lower them to cross chunk boundaries often.
type ckptChunks struct {
	scanFrames, copyBytes, installWrites int
}

// Bounds of one lock hold of a checkpoint (see the file doc).
const (
	ckptScanFrames    = 4096
	ckptCopyBytes     = 256 << 10
	ckptInstallWrites = 2048
)

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
	// A deferred checkpoint is tried again on retry, after a wait that doubles while they
	// stay deferred (ckpt_defer.go); requests and the timer wait for it meanwhile, or every
	// commit that finds the cache under pressure would start another try.
	var retry <-chan time.Time
	var wait time.Duration
	stopRetry := func() {}
	defer func() { stopRetry() }()
	for {
		req, timer := e.ckptReq, tick
		if retry != nil {
			req, timer = nil, nil
		}
		select {
		case <-e.stop:
			return
		case <-req:
		case <-timer:
		case <-retry:
		}
		stopRetry()
		retry, stopRetry = nil, func() {}
		err := e.checkpoint(false)
		switch {
		case errors.Is(err, ErrCheckpointDeferred):
			wait = ckptRetryWait(wait)
			retry, stopRetry = e.ckptRetryTimer(wait)
		case err != nil && !errors.Is(err, ErrClosed) && !errors.Is(err, ErrFailStop):
			e.opts.Logger.Error("storenode: checkpoint", "err", err)
			wait = 0
		default:
			wait = 0
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

// cacheTrigger decides when the dirty set starts a checkpoint. Dirty frames cannot be
// evicted, so a checkpoint must start while the cache still has room (free or clean frames)
// for the frames commits take until it has marked its pages clean; starting earlier than that
// only makes checkpoints more frequent, and random updates over a table the cache holds pay
// for every one of them in whole-table rewrites (a dirty page is written once per checkpoint
// however often it changed: half a 256 MiB cache holding a 192 MB table was a checkpoint per
// ~50K updates, 61% of the storage node's CPU). Guarded by mu.
//
// The room a checkpoint needs is what commits take of the free and clean frames while it runs,
// but only when they need new frames: without allocations a cache full of dirty pages stalls
// nothing. Each checkpoint measures it, per dirty byte it wrote (r), as the frame bytes
// allocated while it ran or, when those were at least 1/64 of what it wrote, the larger of
// them and the bytes turned dirty (a hot set cached beside misses eats clean frames both
// ways); the next one starts when the
// room left, CacheBytes minus the dirty frames and their share of the page index
// (cachePressure), falls below headroom = 2r/(1+2r) of the cache:
// twice the room the last checkpoint's rate asks of a checkpoint writing the rest. It is
// clamped to [CacheBytes/8, CacheBytes/2] and is CacheBytes/2 (the old fixed half-cache
// trigger) before the first checkpoint and after one during which a commit stalled for room;
// a checkpoint during which nothing was committed (idle, or inside replay) keeps it.
// A cache that holds its tables (no allocations) lets the dirty set grow to 7/8 of it and
// leaves the rest to the WAL trigger (walPressure); a cache smaller than the hot set keeps
// the half-cache trigger. Either way the dirty set stays within the cache budget
// (reserveFrames).
type cacheTrigger struct {
	headroom   int64  // room below which a checkpoint starts; 0 = CacheBytes/2
	allocStart int64  // cache.allocBytes when the running checkpoint began
	dirtiedAt  int64  // cache.dirtiedBytes then
	dirtyStart int64  // cache.dirtyBytes then: about the bytes it writes
	rowsStart  uint64 // stats.rowsWritten then: unchanged at its end, nothing was committed beside it
	stalled    bool   // a commit waited for room since the last checkpoint ended
}

// cachePressure reports whether the dirty set leaves less room in the cache than the next
// checkpoint needs (cacheTrigger). Caller holds mu.
//
// The page index's nodes count against the budget beside the frames (pageCache.alloc), and
// a dirty frame's share of them cannot be evicted either: the room is the budget less the
// dirty frames and their share of the index (its bytes per indexed frame). A dirty set
// sparse over its table costs up to a 4 KiB leaf a frame, half of a 4 KiB page's frame; with
// the index left out the trigger waited for a dirty set the budget could never hold, and
// every checkpoint began with a commit stalled on a full cache.
func (e *Engine) cachePressure() bool {
	h := e.trig.headroom
	if h <= 0 {
		h = e.cache.budgetBytes / 2
	}
	return e.cache.budgetBytes-e.cache.dirtyBytes-e.dirtyIndexBytes() < h
}

// dirtyIndexBytes is the dirty frames' share of the page index's bytes. Caller holds mu.
func (e *Engine) dirtyIndexBytes() int64 {
	c := e.cache
	b, n := c.index.bytes, c.index.n
	if n <= 0 || c.dirtyFrames >= n {
		return b
	}
	return int64(float64(b) * float64(c.dirtyFrames) / float64(n))
}

// beginTrigger notes the cache's state as a checkpoint begins. Caller holds mu.
func (e *Engine) beginTrigger() {
	e.trig.allocStart, e.trig.dirtiedAt, e.trig.dirtyStart = e.cache.allocBytes, e.cache.dirtiedBytes, e.cache.dirtyBytes
	e.trig.rowsStart = e.stats.rowsWritten.Load()
}

// endTrigger sets the headroom from the checkpoint that ends (cacheTrigger). Caller holds mu.
func (e *Engine) endTrigger() {
	budget := e.cache.budgetBytes
	alloc, dirty := e.cache.allocBytes-e.trig.allocStart, e.trig.dirtyStart
	if alloc*64 >= dirty {
		alloc = max(alloc, e.cache.dirtiedBytes-e.trig.dirtiedAt)
	}
	defer func() { e.trig.stalled = false }()
	switch {
	case e.trig.stalled:
		e.trig.headroom = budget / 2
	case dirty < budget/64:
		// Too little written to measure a rate by: keep the headroom.
	case e.stats.rowsWritten.Load() == e.trig.rowsStart:
		// No row committed while it ran (an idle timer's or Checkpoint call's checkpoint, one
		// inside replay, one beside grants or table creates only): it measured no commits,
		// not commits that need no room. Keep the headroom, or an idle moment would set the
		// smallest one and the next burst of inserts stall behind a checkpoint of 7/8 of the
		// cache.
	default:
		// headroom = budget * 2r/(1+2r), r = alloc/dirty
		h := int64(float64(budget) * float64(2*alloc) / float64(dirty+2*alloc))
		e.trig.headroom = min(max(h, budget/8), budget/2)
	}
}

// walPressure reports whether the WAL has grown enough since the last checkpoint began to
// start the next one: by CheckpointWALBytes, or by the bytes of the dirty pages if more.
// Caller holds mu.
//
// The dirty set is what the next checkpoint writes, so waiting for at least as many WAL bytes
// bounds the pages checkpoints write to about the bytes logged, whatever the table's size:
// with a fixed trigger, random updates over a table whose dirty set is larger than
// CheckpointWALBytes rewrote nearly every page of it per CheckpointWALBytes of log (a table 10x
// larger cost 2.1x more per update, BenchmarkUpdateRandomScale). The dirty set is itself
// bounded by the cache trigger (cacheTrigger: at most 7/8 of the cache), so the WAL a
// recovery replays stays below max(CheckpointWALBytes, 7/8 CacheBytes) plus what one
// checkpoint's run lets through.
func (e *Engine) walPressure() bool {
	if e.opts.CheckpointWALBytes <= 0 {
		return false
	}
	grown := int64(e.stats.walBytes.Load() - e.walBytesAtCkpt)
	return grown > e.opts.CheckpointWALBytes && grown > e.cache.dirtyBytes
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
	var written []ckptWrite
	renamed := false
	defer func() {
		if err != nil && !replay && !renamed && isFileLimit(err) {
			err = e.deferCheckpoint(written, err) // ckpt_defer.go
		} else if err != nil {
			err = e.fail(err)
			e.broadcastFailure()
		}
	}()

	if snap.txnState != 0 {
		// Fsynced here; its directory entry by syncDataFiles, before the meta names it.
		if err := e.writeTxnState(snap.txnState, snap.txnEntries); err != nil {
			return err
		}
		snap.txnEntries = nil
	}
	written, touched, copiedLSN, err := e.writeDirtyPages(todo)
	if err != nil {
		return err
	}
	if err := e.syncDataFiles(touched); err != nil {
		return err
	}
	// A table of the snapshot dropped since had its dirty pages skipped: the meta file holds
	// it with a page map that misses commits up to the checkpoint LSN, right only once its
	// drop record (replayed after that LSN) is durable.
	acked, err := e.syncWALForCheckpoint(max(snap.ckptLSN, copiedLSN, e.lastDropAfter(snap.ckptLSN), e.ckptCarried), replay)
	if err != nil {
		return err
	}
	newPages, old := e.patchPageMaps(snap, written)
	// Everything the WAL acknowledged is durable, and it has been synced through every record
	// the snapshot copied: a bad record up to here is corruption at the next recovery.
	snap.syncedLSN = acked
	oldLog, err := e.writeMapLog(snap)
	if err != nil {
		return err
	}
	if renamed, err = publishMetaRenamed(e.fs, e.dir, snap); err != nil {
		return err
	}
	e.publishedMapLog(snap, oldLog)
	if snap.txnState != 0 {
		e.removeTxnStates(snap.txnState)
	}
	gone, keepFrom := e.installCheckpoint(snap.ckptLSN, newPages, written, old)
	e.removeDroppedFiles(gone)
	if !replay && e.opts.Proposer == nil { // a replica's log is the group's (truncated by it, stage R6)
		if err := e.log.DropBefore(keepFrom + 1); err != nil {
			return fmt.Errorf("storenode: checkpoint: drop WAL segments: %w", err)
		}
	}
	e.stats.noteCheckpoint(time.Since(start), len(written))
	e.opts.Logger.Debug("storenode: checkpoint", "lsn", snap.ckptLSN, "pages", len(written), "took", time.Since(start))
	return nil
}

// beginCheckpoint takes the checkpoint's snapshot (catalog, grants and dedup table as of the
// checkpoint LSN) under mu, then the list of dirty pages, scanning the frames ckptScanFrames
// at a time with mu released between (a frame dirty at the snapshot stays dirty, and keeps its
// id, until this checkpoint marks it clean: dirty frames are never evicted; a frame dirtied
// after the snapshot may be listed or not; a table created after it is left to the next
// checkpoint). It returns a nil snapshot and no error when
// nothing was logged since the last checkpoint (waiters on ckptGen are woken), and the
// engine's failure, unwrapped, when it is failed or closed.
func (e *Engine) beginCheckpoint() (*metaState, []ckptWrite, error) {
	e.mu.Lock()
	if err := e.failure(); err != nil {
		e.mu.Unlock()
		return nil, nil, err
	}
	if e.lastLSN == e.ckptLSN {
		e.ckptGen++
		e.cond.Broadcast()
		e.mu.Unlock()
		return nil, nil, nil
	}
	snap := e.snapshotMeta()
	e.ckptCarried = 0
	if e.replicated() {
		// A replica's log is the group's: its transaction and move states go to the
		// checkpoint's sidecar instead of carried records (txnstate.go).
		snap.txnState, snap.txnEntries = snap.ckptLSN, e.snapshotTxnState(snap.ckptLSN)
	}
	if !e.replicated() && !e.replaying && (e.txnLive() || len(e.txnForgot) > 0) {
		carried, err := e.carryTxns()
		if err != nil {
			e.mu.Unlock()
			return nil, nil, err
		}
		e.ckptCarried = carried
	}
	if !e.replicated() && !e.replaying && e.moves != nil {
		carried, err := e.carryMoves()
		if err != nil {
			e.mu.Unlock()
			return nil, nil, err
		}
		e.ckptCarried = max(e.ckptCarried, carried)
	}
	e.walBytesAtCkpt = e.stats.walBytes.Load()
	e.beginTrigger()
	e.mu.Unlock()
	carried, err := e.carryPrepared() // in chunks, mu released between
	if err != nil {
		return nil, nil, err
	}
	e.ckptCarried = max(e.ckptCarried, carried)
	e.mu.Lock()
	n := len(e.cache.frames)
	todo := make([]ckptWrite, 0, e.cache.dirtyFrames)
	e.mu.Unlock()
	for lo := 0; lo < n; lo += e.ckptChunk.scanFrames {
		e.mu.Lock()
		for id := lo; id < min(lo+e.ckptChunk.scanFrames, n); id++ {
			f := &e.cache.frames[id]
			if f.key == 0 || !f.dirty {
				continue
			}
			// Only the snapshot's tables: one created since (its id is past the snapshot's
			// next id) is not in the meta file this checkpoint publishes.
			if t := e.tables[uint32(f.key>>32)]; t != nil && t.id < snap.nextTable {
				todo = append(todo, ckptWrite{t: t, page: f.key & (1<<32 - 1), frame: int32(id), key: f.key})
			}
		}
		e.mu.Unlock()
	}
	return snap, todo, nil
}

// writeDirtyPages copies the pages of todo and writes each to a free disk page, a chunk of at
// most ckptCopyBytes at a time: copyChunk under mu, then the writes without it (runs of
// consecutive disk pages of one table in one write). It returns the writes done, reusing
// todo's array, the tables whose data files they touched, and the highest frame LSN copied.
func (e *Engine) writeDirtyPages(todo []ckptWrite) ([]ckptWrite, map[*table]bool, uint64, error) {
	written := todo[:0]
	touched := make(map[*table]bool)
	var copiedLSN uint64
	var buf []byte
	for i := 0; i < len(todo); {
		chunk := todo[i:]
		n, used, err := e.copyChunk(chunk, &buf)
		if err != nil {
			return nil, nil, 0, err
		}
		chunk = chunk[:n]
		i += n
		if err := e.writeChunk(chunk, buf[:used]); err != nil {
			return nil, nil, 0, err
		}
		for _, w := range chunk {
			if w.off < 0 {
				continue
			}
			copiedLSN = max(copiedLSN, w.ent.lsn)
			written = append(written, w) // index <= the chunk's: todo's array is reused safely
			touched[w.t] = true
		}
	}
	return written, touched, copiedLSN, nil
}

// copyChunk copies the first pages of ws into *buf (grown to ckptCopyBytes, or one page if
// larger) under one hold of mu, merging a partial frame with its disk copy first, and gives
// each a free disk page. It returns how many of ws it handled and the bytes of buf used; a
// page that needs no writing (its table dropped) gets off -1.
func (e *Engine) copyChunk(ws []ckptWrite, buf *[]byte) (n, used int, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for n < len(ws) {
		w := &ws[n]
		size := w.t.geo.DiskPageBytes()
		if n > 0 && used+size > e.ckptChunk.copyBytes {
			break
		}
		if cap(*buf) < used+size {
			nb := make([]byte, used, max(e.ckptChunk.copyBytes, used+size))
			copy(nb, *buf)
			*buf = nb
		}
		n++
		w.off = -1
		id, ok := e.cache.lookup(w.key)
		if !ok || id != w.frame || w.t.dropped {
			continue
		}
		if e.cache.frames[id].valid != ^uint64(0) {
			if err := e.loadFrame(w.t, w.page, id); err != nil { // releases mu during the read
				if w.t.dropped {
					continue
				}
				return 0, 0, err
			}
		}
		page := (*buf)[used : used+size]
		k := copy(page, e.cache.rows(id))
		clear(page[k:])
		f := &e.cache.frames[id]
		f.copied = f.lsn
		w.ent.lsn = f.lsn
		w.ent.present = w.t.presentWord(w.page)
		d, _ := w.t.used.NextClear(0)
		w.t.used.Set(d)
		w.ent.disk = uint32(d + 1)
		w.off = used
		used += size
		*buf = (*buf)[:used]
	}
	return n, used, nil
}

// writeChunk checksums the copies of ws (in buf at their offsets) and writes them to their
// disk pages, runs of consecutive disk pages of one table in one write. No lock held: the
// disk pages are set in the used trees, so nothing else writes or frees them.
func (e *Engine) writeChunk(ws []ckptWrite, buf []byte) error {
	for i := 0; i < len(ws); {
		w := &ws[i]
		if w.off < 0 {
			i++
			continue
		}
		size := w.t.geo.DiskPageBytes()
		w.ent.crc = checksum.Of(buf[w.off : w.off+size])
		j := i + 1
		for j < len(ws) && ws[j].off >= 0 && ws[j].t == w.t && ws[j].ent.disk == ws[j-1].ent.disk+1 && ws[j].off == ws[j-1].off+size {
			ws[j].ent.crc = checksum.Of(buf[ws[j].off : ws[j].off+size])
			j++
		}
		last := &ws[j-1]
		d := int64(w.ent.disk - 1)
		if _, err := w.t.data.WriteAt(buf[w.off:last.off+size], d*int64(size)); err != nil {
			return fmt.Errorf("storenode: checkpoint: write %s disk pages %d..%d: %w", dataFileName(e.dir, w.t.id), d, int64(last.ent.disk-1), err)
		}
		e.stats.diskWrites.Add(uint64(j - i))
		i = j
	}
	return nil
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

// syncWALForCheckpoint makes the WAL durable through lsn (the checkpoint LSN, or the highest
// LSN a copied page holds if later: pages are copied after the checkpoint LSN was taken) and
// returns the LSN through which the WAL is known durable: the new meta file's synced LSN.
//
// Outside replay it does not ask the WAL's writer to sync (a sync there holds up every append
// queued behind it): it waits until the WAL has acknowledged lsn, which under SyncAlways means
// synced and under SyncNone written to the files, and then, under SyncNone, fsyncs the
// segment files and the WAL directory itself. Every record acknowledged before those fsyncs
// began is then durable.
func (e *Engine) syncWALForCheckpoint(lsn uint64, replay bool) (uint64, error) {
	if replay {
		// The WAL's recovery made the whole log durable before replay, and the previous
		// meta file proved its synced LSN: keep it, or a bad record below it would pass
		// for a torn tail at the next recovery.
		if err := e.syncWALFiles(); err != nil {
			return 0, fmt.Errorf("storenode: checkpoint: sync WAL: %w", err)
		}
		return max(lsn, e.recoveredSynced), nil
	}
	if err := e.waitDurable(lsn); err != nil {
		return 0, fmt.Errorf("storenode: checkpoint: sync WAL: %w", err)
	}
	acked := max(lsn, e.durableThrough())
	if e.opts.Sync == SyncAlways {
		return acked, nil
	}
	if err := e.syncWALFiles(); err != nil {
		return 0, fmt.Errorf("storenode: checkpoint: sync WAL: %w", err)
	}
	if err := e.fs.SyncDir(walDir(e.dir)); err != nil {
		return 0, fmt.Errorf("storenode: checkpoint: sync WAL dir: %w", err)
	}
	return acked, nil
}

// lastDropAfter returns the LSN of the latest drop record after lsn (0 when none). Called
// after the copies: a table dropped later had every page the checkpoint listed copied.
func (e *Engine) lastDropAfter(lsn uint64) uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	var last uint64
	for _, t := range e.dropped {
		if t.dropLSN > lsn {
			last = max(last, t.dropLSN)
		}
	}
	return last
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
	// A backup starts under ckptMu, which this checkpoint holds: none starts meanwhile, so
	// held can only turn false (a release frees heldPages under mu).
	for id, pm := range newPages {
		if t := e.tablesByIDAll(id); t != nil {
			t.io.Lock()
			t.pages = pm
			t.io.Unlock()
		}
	}
	e.mu.Unlock()
	// The replaced copies: each written page's old entry (a page is written once per
	// checkpoint), freed now that no published map refers to it; and the copied frames,
	// clean unless written again since. ckptInstallWrites per hold of mu.
	for lo := 0; lo < len(written); lo += e.ckptChunk.installWrites {
		e.mu.Lock()
		held := len(e.backups) > 0
		for i := lo; i < min(lo+e.ckptChunk.installWrites, len(written)); i++ {
			w := &written[i]
			if ent := old[i]; ent.disk != 0 && ent.disk != w.ent.disk && e.tablesByIDAll(w.t.id) == w.t {
				if held {
					e.heldPages = append(e.heldPages, heldPage{t: w.t, disk: ent.disk, since: ckptLSN})
				} else {
					w.t.used.Clear(uint64(ent.disk - 1))
				}
			}
			if id, ok := e.cache.lookup(w.key); ok && id == w.frame {
				if f := &e.cache.frames[id]; f.lsn == f.copied {
					e.cache.markClean(id)
				}
			}
		}
		e.mu.Unlock()
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.ckptLSN = ckptLSN
	e.ckptGen++
	e.endTrigger()
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

// snapshotMeta captures the catalog, grants and dedup table at e.lastLSN. Caller holds mu.
func (e *Engine) snapshotMeta() *metaState {
	m := &metaState{ckptLSN: e.lastLSN, nextTable: e.nextTable, owners: make(map[uint64]ownerState, len(e.owners))}
	for _, id := range sortedTableIDs(e.tables) {
		t := e.tables[id]
		m.tables = append(m.tables, metaTable{
			id: t.id, rowBytes: t.geo.RowBytes(), name: t.name, nextID: t.nextID,
			holder: t.holder, epoch: t.epoch, pages: t.pages, cluster: t.cluster,
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
