package storenode

import (
	"context"
	"encoding/binary"
	"fmt"
	"path"
	"slices"
	"sort"
	"time"

	"github.com/weftdb/weft/internal/vfs"
)

// Restore. A backup is written into a new directory by a BackupDir: first the marker
// backupIncompleteName (Open refuses a directory holding it: ErrBackupIncomplete), then the
// files, then, once every file and the directory are synced, the marker restoredName, and the
// first marker is removed. The first Open of such a directory recovers it as after a crash
// (meta, then WAL replay), then bumps every table's epoch by restoreEpochGap and frees the
// table (a grant to no holder, logged and synced like any grant) and only then removes
// restoredName. No holder: the original's owner is fenced on the copy for good, and were it
// kept as the holder, its requests (each renews its leases) would keep the table from every
// other owner for as long as it stays connected.
//
// Why at the first open and not when the backup is written: the copy's WAL tail is replayed
// after its meta file, and its ownership records would set the epochs back to the original's;
// the bump has to come after replay, in a record of its own. And the copy stays a faithful
// image of the original's files until it is used (a copy checked or copied again first is
// bumped where it is started). A crash between the bump and the marker's removal bumps again
// at the next open: harmless, epochs only grow.
//
// Why by restoreEpochGap and not by one: the original kept running after the backup and may
// have granted a table many more times; a transaction node holding any of those grants must
// be fenced by the copy. A gap of 2^32 grants covers every grant the original can have made
// (a grant is a synced WAL record: at 10,000 a second that is five days of nothing but
// grants of one table).
//
// A cluster-managed table (cluster.go) is not bumped: its floor is raised to etcd's current
// revision (GrantVerifier.Revision, a linearizable read), with no holder. A bump by 2^32
// would put it far above every revision etcd will reach and refuse every future grant; etcd's
// current revision is above every grant the original can have accepted, and the next grant
// (a new owner key) is above it. So the first open of a copy holding cluster tables needs
// etcd: without it (no GrantVerifier, or etcd unreachable) Open fails and the marker stays.

// Part of the format; do not change.
const (
	backupIncompleteName = "BACKUP-INCOMPLETE"
	restoredName         = "RESTORED"
	restoreMagic         = "WEFTRSTR"
	restoreEpochGap      = 1 << 32
)

// backupFilesMax bounds the files a BackupDir accepts: the tables a store may hold and a
// generous number of WAL segments.
const backupFilesMax = 1 << 20

// backupFileBytesMax bounds any offset a BackupDir writes at: a data file's largest disk
// page end (2^30 logical pages of at most 256 KiB) is far below it.
const backupFileBytesMax = 1 << 50

// BackupDir writes a backup into a new directory: it is the BackupSink of a restore. Create
// it with NewBackupDir, hand it to Engine.Backup (or feed it the pieces of a remote backup),
// then call Finish with the backup's BackupInfo. Until Finish succeeds the directory is
// marked incomplete and Open refuses it. One goroutine at a time.
type BackupDir struct {
	fs    vfs.FS
	dir   string
	cur   BackupFile
	f     vfs.File
	end   int64 // the current file's next offset
	seen  map[BackupFile]bool
	meta  bool
	done  bool
	bytes int64
}

// NewBackupDir creates dir (which must not exist, or be empty) and marks it incomplete. fsys
// is the file system; vfs.Default when nil.
func NewBackupDir(fsys vfs.FS, dir string) (*BackupDir, error) {
	if fsys == nil {
		fsys = vfs.Default
	}
	if names, err := fsys.List(dir); err == nil && len(names) > 0 {
		return nil, fmt.Errorf("storenode: backup into %s: the directory is not empty", dir)
	}
	if err := fsys.MkdirAll(walDir(dir)); err != nil {
		return nil, fmt.Errorf("storenode: backup into %s: %w", dir, err)
	}
	f, err := fsys.Create(path.Join(dir, backupIncompleteName))
	if err != nil {
		return nil, fmt.Errorf("storenode: backup into %s: %w", dir, err)
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = syncDirs(fsys, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("storenode: backup into %s: %w", dir, err)
	}
	return &BackupDir{fs: fsys, dir: dir, seen: make(map[BackupFile]bool)}, nil
}

// syncDirs makes dir's entry in its parent, dir's own and its wal directory's durable.
func syncDirs(fsys vfs.FS, dir string) error {
	for _, d := range []string{path.Dir(path.Clean(dir)), dir, walDir(dir)} {
		if err := fsys.SyncDir(d); err != nil {
			return err
		}
	}
	return nil
}

// WriteChunk writes one piece of a backup file (BackupSink). It refuses a file sent twice,
// pieces out of order, offsets beyond any store file and more files than a store has, each
// with an error wrapping ErrMalformed, before it writes anything.
func (d *BackupDir) WriteChunk(ctx context.Context, f BackupFile, off int64, b []byte) error {
	if d.done {
		return fmt.Errorf("%w: backup piece after Finish", ErrMalformed)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	name, err := f.Path()
	if err != nil {
		return err
	}
	if off < 0 || off > backupFileBytesMax || int64(len(b)) > BackupChunkMax {
		return fmt.Errorf("%w: backup piece of %d bytes at offset %d of %s", ErrMalformed, len(b), off, name)
	}
	if f != d.cur || d.f == nil {
		if d.seen[f] {
			return fmt.Errorf("%w: backup file %s sent twice", ErrMalformed, name)
		}
		if off != 0 {
			return fmt.Errorf("%w: backup file %s starts at offset %d", ErrMalformed, name, off)
		}
		if len(d.seen) >= backupFilesMax {
			return fmt.Errorf("%w: more than %d backup files", ErrMalformed, backupFilesMax)
		}
		if err := d.closeFile(); err != nil {
			return err
		}
		nf, err := d.fs.Create(path.Join(d.dir, name))
		if err != nil {
			return fmt.Errorf("storenode: backup into %s: %w", d.dir, err)
		}
		d.f, d.cur, d.end = nf, f, 0
		d.seen[f] = true
		if f.Kind == BackupMeta {
			d.meta = true
		}
	}
	if off < d.end {
		return fmt.Errorf("%w: backup piece at offset %d of %s, before %d", ErrMalformed, off, name, d.end)
	}
	if len(b) == 0 {
		return nil
	}
	if _, err := d.f.WriteAt(b, off); err != nil {
		return fmt.Errorf("storenode: backup into %s: write %s: %w", d.dir, name, err)
	}
	d.end = off + int64(len(b))
	d.bytes += int64(len(b))
	return nil
}

// closeFile syncs and closes the file being written.
func (d *BackupDir) closeFile() error {
	if d.f == nil {
		return nil
	}
	name, _ := d.cur.Path()
	err := d.f.Sync()
	if cerr := d.f.Close(); err == nil {
		err = cerr
	}
	d.f = nil
	if err != nil {
		return fmt.Errorf("storenode: backup into %s: %s: %w", d.dir, name, err)
	}
	return nil
}

// Finish completes the backup: it syncs every file and directory, then marks the directory
// as a restored copy (its first Open bumps every table's epoch) instead of incomplete.
func (d *BackupDir) Finish(info BackupInfo) error {
	if d.done {
		return nil
	}
	if !d.meta {
		return fmt.Errorf("%w: the backup holds no meta file", ErrMalformed)
	}
	if err := d.closeFile(); err != nil {
		return err
	}
	if err := syncDirs(d.fs, d.dir); err != nil {
		return fmt.Errorf("storenode: backup into %s: %w", d.dir, err)
	}
	b := []byte(restoreMagic)
	b = binary.LittleEndian.AppendUint64(b, info.CheckpointLSN)
	b = binary.LittleEndian.AppendUint64(b, info.ThroughLSN)
	f, err := d.fs.Create(path.Join(d.dir, restoredName))
	if err != nil {
		return fmt.Errorf("storenode: backup into %s: %w", d.dir, err)
	}
	_, err = f.WriteAt(b, 0)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = d.fs.Remove(path.Join(d.dir, backupIncompleteName))
	}
	if err == nil {
		err = d.fs.SyncDir(d.dir)
	}
	if err != nil {
		return fmt.Errorf("storenode: backup into %s: %w", d.dir, err)
	}
	d.done = true
	return nil
}

// Close closes the file being written. A directory closed before Finish stays marked
// incomplete.
func (d *BackupDir) Close() error {
	if d.f == nil {
		return nil
	}
	err := d.f.Close()
	d.f = nil
	return err
}

// Bytes reports the file bytes written so far.
func (d *BackupDir) Bytes() int64 { return d.bytes }

// checkNotIncomplete refuses a directory a backup did not finish. Open calls it first.
func checkNotIncomplete(fsys vfs.FS, dir string) error {
	ok, err := hasFile(fsys, dir, backupIncompleteName)
	if err != nil {
		return err
	}
	if ok {
		return fmt.Errorf("%w: %s (remove it and take the backup again)", ErrBackupIncomplete, dir)
	}
	return nil
}

// hasFile reports whether dir lists name; a missing dir holds nothing.
func hasFile(fsys vfs.FS, dir, name string) (bool, error) {
	names, err := fsys.List(dir)
	if err != nil {
		if isNotExist(err) {
			return false, nil
		}
		return false, fmt.Errorf("storenode: open %s: %w", dir, err)
	}
	return slices.Contains(names, name), nil
}

// finishRestore runs after recovery: on a restored copy's first open it bumps every table's
// epoch by restoreEpochGap, with no holder, logged and synced, then removes the marker (see
// the file doc).
func (e *Engine) finishRestore() error {
	marker := path.Join(e.dir, restoredName)
	if ok, err := hasFile(e.fs, e.dir, restoredName); err != nil || !ok {
		return err
	}
	// Cluster tables take etcd's current revision as their floor instead of the bump (see
	// the file doc), read before any lock is taken.
	floor, err := e.restoreFloor()
	if err != nil {
		return fmt.Errorf("storenode: restore: %w", err)
	}
	e.mu.Lock()
	ids := make([]uint32, 0, len(e.tables))
	for id := range e.tables {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		t := e.tables[id]
		if t.cluster.IsCluster() {
			// No holder and etcd's revision: every grant made up to now is refused, the next
			// one (a new owner key, a higher revision) is accepted.
			epoch := max(t.epoch+1, floor) // strictly above: an epoch is never logged twice
			e.scratch = appendGrantOwnerRecord(e.scratch[:0], t.id, 0, epoch)
			if err := e.appendAndWait(kindGrantOwner, e.scratch); err != nil {
				e.mu.Unlock()
				return fmt.Errorf("storenode: restore: raise the floor of %q: %w", t.name, err)
			}
			e.leaseMu.Lock()
			e.applyGrantOwnerLocked(t, 0, epoch)
			t.leaseUntil = time.Time{}
			e.leaseMu.Unlock()
			continue
		}
		if t.epoch > ^uint64(0)-restoreEpochGap {
			e.mu.Unlock()
			return fmt.Errorf("storenode: restore: table %q: epoch %d cannot be bumped", t.name, t.epoch)
		}
		// No holder (see the file doc).
		epoch := t.epoch + restoreEpochGap
		e.scratch = appendGrantOwnerRecord(e.scratch[:0], t.id, 0, epoch)
		if err := e.appendAndWait(kindGrantOwner, e.scratch); err != nil {
			e.mu.Unlock()
			return fmt.Errorf("storenode: restore: bump the epoch of %q: %w", t.name, err)
		}
		e.leaseMu.Lock()
		e.applyGrantOwnerLocked(t, 0, epoch)
		t.leaseUntil = time.Time{}
		e.leaseMu.Unlock()
	}
	e.mu.Unlock()
	if err := e.fs.Remove(marker); err != nil {
		return fmt.Errorf("storenode: restore: %w", err)
	}
	if err := e.fs.SyncDir(e.dir); err != nil {
		return fmt.Errorf("storenode: restore: sync dir: %w", err)
	}
	e.opts.Logger.Info("storenode: opened a restored backup: every table's epoch was bumped", "dir", e.dir, "tables", len(ids))
	return nil
}
