package storenode

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"sync"
	"time"

	"github.com/weftdb/weft/internal/checksum"
	"github.com/weftdb/weft/internal/corrupt"
)

// Online backup. Engine.Backup copies a running store without stopping commits: a
// checkpoint-consistent snapshot (the published meta file and the disk pages its page maps
// refer to) plus the WAL from the snapshot's checkpoint LSN through every batch acknowledged
// when the copy of the data pages ended. Recovery of the copy is recovery after a crash at
// that moment: load the meta, replay the tail.
//
// Invariants while a backup holds its snapshot (a backupHold in Engine.backups):
//   - No disk page the snapshot refers to is reused: a checkpoint that replaces a page's disk
//     copy does not free the old disk page but appends it to Engine.heldPages (it stays set
//     in the table's used tree, with the replacing checkpoint's LSN); a release frees those
//     no remaining hold's snapshot is older than (heldBefore), so overlapping backups do not
//     keep every page for ever.
//   - No data file of a table in the snapshot is removed (dropped tables stay in
//     Engine.dropped while a hold's snapshot is older than the drop), and no WAL segment holding a record after the snapshot's checkpoint
//     LSN is dropped (checkpoint's DropBefore stops at the oldest hold's LSN).
//   - Every read of the backup's goroutine happens under hold.mu (R) after it checked that
//     the hold is live; release takes hold.mu (W) before it frees anything. So a hold that
//     ends (the backup returned, its context ended, Options.BackupTimeout ran out while the
//     sink blocked, Close) never lets a reused page be copied.
// Checkpoints keep running meanwhile: only their frees wait, so the data files grow by what
// is written during the backup, for at most BackupTimeout.

// BackupChunkMax is the largest piece Backup hands its sink in one call.
const BackupChunkMax = 1 << 20

// backupsMax bounds the backups running at once on an engine.
const backupsMax = 4

// BackupFileKind says which of a store's files a backup piece belongs to.
type BackupFileKind uint8

// Kinds of backup files. Part of the wire format (sgio.BackupChunk); do not change.
const (
	// BackupEnd is no file: the last piece of a backup, carrying its BackupInfo.
	BackupEnd BackupFileKind = 0
	// BackupMeta is the meta file (Num 0).
	BackupMeta BackupFileKind = 1
	// BackupData is a table's data file (Num: the table id).
	BackupData BackupFileKind = 2
	// BackupWAL is a WAL segment (Num: its first LSN).
	BackupWAL BackupFileKind = 3
	// BackupMapLog is the map log through the meta file's published length (Num: its
	// generation).
	BackupMapLog BackupFileKind = 4
)

// BackupFile names one file of a backup by kind and number, never by a path, so a sink
// builds the path itself (BackupFile.Path) and a hostile peer cannot name another file.
type BackupFile struct {
	Kind BackupFileKind
	Num  uint64
}

// Path returns the file's slash-separated path relative to the store's directory, or an
// error wrapping ErrMalformed for a kind or number no store has.
func (f BackupFile) Path() (string, error) {
	switch {
	case f.Kind == BackupMeta && f.Num == 0:
		return metaName, nil
	case f.Kind == BackupData && f.Num != 0 && f.Num <= 1<<32-1:
		return path.Base(dataFileName("", uint32(f.Num))), nil
	case f.Kind == BackupMapLog && f.Num != 0:
		return mapLogName(f.Num), nil
	case f.Kind == BackupWAL && f.Num != 0:
		return path.Join("wal", fmt.Sprintf("wal-%016x.log", f.Num)), nil
	}
	return "", fmt.Errorf("%w: backup file kind %d number %d", ErrMalformed, f.Kind, f.Num)
}

// BackupSink receives a backup's files in pieces. The engine calls it from the goroutine
// that called Backup, one call at a time.
type BackupSink interface {
	// WriteChunk writes b at offset off of file f, creating the file on its first piece (an
	// empty b at offset 0 creates an empty file). The pieces of one file come one after the
	// other, in offset order; no file comes twice. b is at most BackupChunkMax bytes and
	// valid during the call only. It must return once ctx is done.
	WriteChunk(ctx context.Context, f BackupFile, off int64, b []byte) error
}

// BackupInfo describes a finished backup.
type BackupInfo struct {
	// CheckpointLSN is the snapshot's checkpoint: the copy replays the WAL after it.
	CheckpointLSN uint64
	// ThroughLSN is where the copied WAL ends: every batch acknowledged before Backup was
	// called is at or below it, and no record after it is in the copy.
	ThroughLSN uint64
	// Files and Bytes count what the sink received.
	Files int
	Bytes int64
}

// backupHold is one running backup's hold on its snapshot.
type backupHold struct {
	ckptLSN uint64
	mu      sync.RWMutex // R: a read of the snapshot's files; W: the release
	ended   bool         // guarded by mu
	why     error        // guarded by mu: why the hold ended
	timer   *time.Timer  // guarded by mu: ends the hold after Options.BackupTimeout
}

// heldPage is a disk page a checkpoint replaced while a backup held the snapshot.
type heldPage struct {
	t     *table
	disk  uint32 // disk page + 1
	since uint64 // the checkpoint LSN of the checkpoint that replaced it
}

// heldBefore reports whether a running backup's snapshot is older than checkpoint LSN lsn:
// it maps the disk pages a checkpoint at lsn replaced, and holds the tables dropped before
// lsn (and after the snapshot). Snapshots taken at or after lsn need neither. Caller holds mu.
func (e *Engine) heldBefore(lsn uint64) bool {
	for _, h := range e.backups {
		if h.ckptLSN < lsn {
			return true
		}
	}
	return false
}

// Backup copies the store to sink while commits go on, and returns what it copied. It first
// runs a checkpoint (so the WAL tail to copy is short), then holds the published checkpoint
// (see the file doc) while it sends the meta file, every disk page of its page maps
// (checked against the map's CRC32C first: a damaged page fails the backup with
// corrupt.ErrCorruption, it is never copied) and the WAL from the checkpoint LSN on, cut
// after the last record acknowledged by then. The hold ends when Backup returns, at the
// latest after Options.BackupTimeout (then Backup fails with ErrBackupTimeout), and at
// Close (ErrClosed). At most four backups run at once (ErrBackupBusy beyond). Memory: the
// snapshot's meta file and its decoded page maps (about 50 bytes a logical page), one
// table's list of disk pages (8 bytes each) and one piece of at most BackupChunkMax (or one
// WAL record). Any goroutine may call it.
func (e *Engine) Backup(ctx context.Context, sink BackupSink) (BackupInfo, error) {
	e.mu.Lock()
	err := e.usable()
	if err == nil && len(e.backups) >= backupsMax {
		// Before the checkpoint, so refused backups cost nothing; holdSnapshot checks again.
		err = fmt.Errorf("%w: %d backups running", ErrBackupBusy, len(e.backups))
	}
	e.mu.Unlock()
	if err != nil {
		return BackupInfo{}, err
	}
	if err := e.checkpoint(false); err != nil {
		return BackupInfo{}, err
	}
	m, metaBytes, h, err := e.holdSnapshot()
	if err != nil {
		return BackupInfo{}, err
	}
	defer e.releaseBackup(h, nil)
	ctx, cancel := context.WithTimeout(ctx, e.opts.BackupTimeout)
	defer cancel()
	b := &backupRun{e: e, h: h, sink: sink, info: BackupInfo{CheckpointLSN: m.ckptLSN}}
	err = b.run(ctx, m, metaBytes)
	if err != nil {
		if why := h.endedWhy(); why != nil {
			err = fmt.Errorf("%w (%w)", why, err)
		} else if ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("%w: after %v: %w", ErrBackupTimeout, e.opts.BackupTimeout, err)
		}
		return BackupInfo{}, err
	}
	return b.info, nil
}

// holdSnapshot reads the published meta file and registers a hold on it, under ckptMu so no
// checkpoint publishes meanwhile.
func (e *Engine) holdSnapshot() (*metaState, []byte, *backupHold, error) {
	e.ckptMu.Lock()
	defer e.ckptMu.Unlock()
	b, err := readMetaBytes(e)
	if err != nil {
		return nil, nil, nil, err
	}
	m, err := decodeMeta(b)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("storenode: backup: %s: %w", path.Join(e.dir, metaName), err)
	}
	// The map log through its published length, read now under ckptMu: a later checkpoint
	// only appends beyond it, and a compaction removes it.
	if m.version >= metaVersion {
		if m.mapLog, err = loadMapLog(e.fs, e.dir, m, false); err != nil {
			return nil, nil, nil, fmt.Errorf("storenode: backup: %w", err)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.usable(); err != nil {
		return nil, nil, nil, err
	}
	if m.ckptLSN != e.ckptLSN {
		return nil, nil, nil, corrupt.Errorf("storenode: backup: %s: checkpoint LSN %d, the engine published %d",
			path.Join(e.dir, metaName), m.ckptLSN, e.ckptLSN)
	}
	if len(e.backups) >= backupsMax {
		return nil, nil, nil, fmt.Errorf("%w: %d backups running", ErrBackupBusy, len(e.backups))
	}
	h := &backupHold{ckptLSN: m.ckptLSN}
	e.backups = append(e.backups, h)
	// Under h.mu: the timer may fire at once; its release waits for h.mu, then for mu.
	h.mu.Lock()
	h.timer = time.AfterFunc(e.opts.BackupTimeout, func() {
		e.releaseBackup(h, fmt.Errorf("%w: it held its snapshot for %v", ErrBackupTimeout, e.opts.BackupTimeout))
	})
	h.mu.Unlock()
	return m, b, h, nil
}

// readMetaBytes reads the published meta file whole. Caller holds ckptMu.
func readMetaBytes(e *Engine) ([]byte, error) {
	name := path.Join(e.dir, metaName)
	f, err := e.fs.Open(name)
	if err != nil {
		return nil, fmt.Errorf("storenode: backup: open %s: %w", name, err)
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return nil, fmt.Errorf("storenode: backup: size of %s: %w", name, err)
	}
	// The meta file holds 24 bytes per page of every table (plus owners): bound it by what
	// the engine's tables can hold before allocating.
	if size < metaHeaderBytes+metaTrailerBytes || size > metaBytesMax {
		return nil, corrupt.Errorf("storenode: backup: %s: size %d", name, size)
	}
	b := make([]byte, size)
	if _, err := f.ReadAt(b, 0); err != nil {
		return nil, fmt.Errorf("storenode: backup: read %s: %w", name, err)
	}
	return b, nil
}

func (h *backupHold) endedWhy() error {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.why
}

// releaseBackup ends hold h (idempotent): no read of its backup starts after it, and when it
// was the last hold, the disk pages checkpoints replaced meanwhile are freed. why, when not
// nil, is what the backup's next read returns.
func (e *Engine) releaseBackup(h *backupHold, why error) {
	h.mu.Lock()
	if h.ended {
		h.mu.Unlock()
		return
	}
	h.ended = true
	if why == nil {
		why = fmt.Errorf("%w: the backup's hold on its snapshot was released", ErrClosed)
	}
	h.why = why
	h.timer.Stop()
	h.mu.Unlock()

	e.mu.Lock()
	defer e.mu.Unlock()
	e.backups = slices.DeleteFunc(e.backups, func(x *backupHold) bool { return x == h })
	// Free the pages no remaining snapshot maps: those replaced at or before the oldest
	// remaining hold's checkpoint (a later backup's snapshot never maps them).
	keep := e.heldPages[:0]
	for _, p := range e.heldPages {
		if e.heldBefore(p.since) {
			keep = append(keep, p)
			continue
		}
		p.t.io.Lock()
		p.t.used.Clear(uint64(p.disk - 1))
		p.t.io.Unlock()
	}
	clear(e.heldPages[len(keep):])
	e.heldPages = keep
	if len(e.dropped) > 0 {
		e.requestCheckpoint() // it removes the data files no remaining backup needs
	}
}

// releaseAllBackups ends every hold, for Close.
func (e *Engine) releaseAllBackups() {
	e.mu.Lock()
	hs := slices.Clone(e.backups)
	e.mu.Unlock()
	for _, h := range hs {
		e.releaseBackup(h, fmt.Errorf("%w: the store is closing", ErrClosed))
	}
}

// holdFloor is the lowest checkpoint LSN a backup holds, or lsn when none is lower. Caller
// holds mu.
func (e *Engine) holdFloor(lsn uint64) uint64 {
	for _, h := range e.backups {
		lsn = min(lsn, h.ckptLSN)
	}
	return lsn
}

// BackupHold reports the backups holding a snapshot and the disk pages kept from reuse for
// them: an operator's view (and a test's) of what a running or stuck backup costs.
func (e *Engine) BackupHold() (backups, heldPages int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.backups), len(e.heldPages)
}

// backupRun is one Backup's state, on its goroutine.
type backupRun struct {
	e    *Engine
	h    *backupHold
	sink BackupSink
	info BackupInfo
	buf  []byte
}

func (b *backupRun) run(ctx context.Context, m *metaState, metaBytes []byte) error {
	if err := b.send(ctx, BackupFile{Kind: BackupMeta}, 0, metaBytes, true); err != nil {
		return err
	}
	if m.logGen != 0 {
		if err := b.send(ctx, BackupFile{Kind: BackupMapLog, Num: m.logGen}, 0, m.mapLog, true); err != nil {
			return err
		}
	}
	for i := range m.tables {
		if err := b.table(ctx, &m.tables[i]); err != nil {
			return err
		}
	}
	// Everything acknowledged before Backup was called is durable now; take the durable LSN
	// after the data pages, so the copy is as recent as it can be.
	through := b.e.durableThrough()
	b.info.ThroughLSN = max(through, m.ckptLSN)
	err := b.e.log.Copy(ctx, m.ckptLSN, through, func(first uint64, off int64, p []byte) error {
		if err := b.live(); err != nil {
			return err
		}
		return b.send(ctx, BackupFile{Kind: BackupWAL, Num: first}, off, p, off == 0)
	})
	if err != nil {
		return fmt.Errorf("storenode: backup: copy the WAL: %w", err)
	}
	return nil
}

// live reports why the hold ended, if it did.
func (b *backupRun) live() error {
	b.h.mu.RLock()
	defer b.h.mu.RUnlock()
	if b.h.ended {
		return b.h.why
	}
	return nil
}

// send hands p to the sink in pieces of at most BackupChunkMax, counting a new file.
func (b *backupRun) send(ctx context.Context, f BackupFile, off int64, p []byte, newFile bool) error {
	if newFile {
		b.info.Files++
	}
	for first := true; first || len(p) > 0; first = false {
		n := min(len(p), BackupChunkMax)
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := b.sink.WriteChunk(ctx, f, off, p[:n]); err != nil {
			return err
		}
		b.info.Bytes += int64(n)
		off += int64(n)
		p = p[n:]
	}
	return nil
}

// table copies the disk pages of one table's snapshot page map, in disk page order, in runs
// of consecutive disk pages, each page checked against its CRC32C.
func (b *backupRun) table(ctx context.Context, mt *metaTable) error {
	b.e.mu.Lock()
	t := b.e.tablesByIDAll(mt.id)
	b.e.mu.Unlock()
	if t == nil {
		return fmt.Errorf("storenode: backup: table %d of the snapshot is gone (its data file was removed)", mt.id)
	}
	type diskRef struct {
		disk uint32
		crc  uint32
	}
	refs := make([]diskRef, 0, mt.pages.count())
	for _, ent := range mt.pages.all() {
		if ent.disk != 0 {
			refs = append(refs, diskRef{ent.disk, ent.crc})
		}
	}
	slices.SortFunc(refs, func(x, y diskRef) int { return cmp.Compare(x.disk, y.disk) })
	for k := 1; k < len(refs); k++ {
		if refs[k].disk == refs[k-1].disk {
			return corrupt.Errorf("storenode: backup: table %d: disk page %d referenced twice", mt.id, refs[k].disk-1)
		}
	}
	f := BackupFile{Kind: BackupData, Num: uint64(mt.id)}
	if err := b.send(ctx, f, 0, nil, true); err != nil {
		return err
	}
	pageBytes := t.geo.DiskPageBytes()
	perRun := max(1, BackupChunkMax/pageBytes)
	if cap(b.buf) < perRun*pageBytes {
		b.buf = make([]byte, perRun*pageBytes)
	}
	for i := 0; i < len(refs); {
		j := i + 1
		for j < len(refs) && j-i < perRun && refs[j].disk == refs[j-1].disk+1 {
			j++
		}
		off := int64(refs[i].disk-1) * int64(pageBytes)
		buf := b.buf[:(j-i)*pageBytes]
		if err := b.readPages(t, buf, off); err != nil {
			return err
		}
		for k := i; k < j; k++ {
			page := buf[(k-i)*pageBytes:][:pageBytes]
			if got := checksum.Of(page); got != refs[k].crc {
				return corrupt.Errorf("storenode: backup: %s disk page %d: checksum %#08x, want %#08x",
					dataFileName(b.e.dir, mt.id), refs[k].disk-1, got, refs[k].crc)
			}
		}
		if err := b.send(ctx, f, off, buf, false); err != nil {
			return err
		}
		i = j
	}
	return nil
}

// readPages reads buf at off of t's data file under the hold (see the file doc).
func (b *backupRun) readPages(t *table, buf []byte, off int64) error {
	b.h.mu.RLock()
	defer b.h.mu.RUnlock()
	if b.h.ended {
		return b.h.why
	}
	if _, err := t.data.ReadAt(buf, off); err != nil {
		return fmt.Errorf("storenode: backup: read %s at %d: %w", dataFileName(b.e.dir, t.id), off, err)
	}
	return nil
}
