package storenode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/storenode/wal"
)

// Check: an offline check of a stopped store's directory, like `bbolt check` (the `weft
// verify` command). It reads what recovery reads, with recovery's own decoders and rules
// (loadMeta, the WAL's recovery scan, the record decoders), and more than recovery reads:
//
//   - the directory: a backup that did not finish (BACKUP-INCOMPLETE, which Open refuses) is
//     damage, a restored copy not opened yet (RESTORED) a note, and a table epoch its first
//     Open could not bump damage; a missing meta file is damage when WAL segments or data
//     files exist (Open refuses it rather than remove them as orphans);
//   - meta: its checksum, header and every table and owner entry (decodeMeta), and no two
//     tables sharing a name;
//   - the map log (version 4): present and at least the published length long, every record
//     through that length (checksum, fields, a clear of an existing entry) and the tables'
//     counts (decodeMapLog); damage names the map log's file and the record's offset, and a
//     page-map finding the offset of the entry in the last record that set it. Bytes beyond
//     the published length and map logs the meta file does not name are notes (Open
//     truncates and removes them);
//   - page maps against the data files: every mapped disk page lies inside its data file, no
//     two logical pages share a disk page, a page without a disk page has no rows, every mapped
//     page's CRC32C matches its entry, and its absent slots and padding are zero;
//   - free disk pages: the format keeps no free list (a disk page is free exactly when no entry
//     maps it, and a checkpoint takes the lowest free one), so "free and used at once" can only
//     show as a page mapped twice or rows without a disk page, and a leaked page cannot be told
//     from a free one: the report counts them;
//   - the WAL: every segment (damage in one wholly at or below the checkpoint LSN, which
//     recovery does not read, is a note), every record's checksum, lengths and LSN order, the
//     torn tail versus corruption decision (a bad record at or below the checkpoint's synced
//     LSN, or proved durable by a later record or segment, is corruption; a torn tail after it
//     is reported as a note), and that the log reaches the synced LSN;
//   - the backup markers: BACKUP-INCOMPLETE is damage (Open refuses the directory), RESTORED
//     a note (the first Open bumps every epoch);
//   - the catalog as replay would build it: tables created, dropped, granted ids and
//     ownership in order (an epoch above the table's), every commit segment naming a live table with its row size, a page
//     below the limit and rows below the table's granted ids (ids are granted, and synced,
//     before a row is written), and no page-map entry holding rows at or above them or a page
//     LSN after the WAL's last record (a checkpoint syncs the WAL through every page it
//     writes).
//
// It takes the store's lock (so it refuses a directory a running process holds; a lock file
// that does not exist cannot be taken without creating it, so Check fails instead if one
// exists once it is done: an Open began meanwhile) and opens
// every file read-only through vfs.ReadOnly: it never changes a byte, whatever it finds. Its
// memory is the page maps (24 bytes a logical page, as Open loads them), one bit and four
// bytes a mapped disk page, one disk page buffer and the WAL's read window: data files and
// WAL segments are streamed.

// checkCtxEvery is how many disk pages or WAL records Check reads between two looks at its
// context.
const checkCtxEvery = 1024

// CheckOptions configure Check. The zero value is valid.
type CheckOptions struct {
	// FS is the file system the directory lives in: vfs.Default when nil. Check reads it
	// through vfs.ReadOnly.
	FS vfs.FS
	// MaxFindings bounds the findings kept in the report (the rest are counted in
	// CheckReport.Omitted). 0 means 1000.
	MaxFindings int
}

// Finding is one thing Check found: damage, or a note about a state recovery handles (a torn
// WAL tail, a file recovery removes).
type Finding struct {
	// Damage is true for damage (Check's caller should fail), false for a note.
	Damage bool
	// File is the file the finding is about, relative to the store's directory ("meta",
	// "table-00000001.dat", "wal/wal-0000000000000001.log"), or "" for the directory.
	File string
	// Offset is the byte offset in File, -1 when the finding names no byte.
	Offset int64
	// Table is the table's id, 0 when none. Page is its logical page and DiskPage the disk
	// page, -1 when none. LSN is the WAL record's, 0 when none.
	Table    uint32
	Page     int64
	DiskPage int64
	LSN      uint64
	// What says what is wrong, with what was expected and what was found.
	What string
}

// String formats f on one line: "damage: FILE offset N: table T page P disk page D: LSN L:
// WHAT", leaving out the parts f does not name.
func (f Finding) String() string {
	var b strings.Builder
	if f.Damage {
		b.WriteString("damage: ")
	} else {
		b.WriteString("note: ")
	}
	if f.File != "" {
		b.WriteString(f.File)
		if f.Offset >= 0 {
			fmt.Fprintf(&b, " offset %d", f.Offset)
		}
		b.WriteString(": ")
	}
	if f.Table != 0 {
		fmt.Fprintf(&b, "table %d", f.Table)
		if f.Page >= 0 {
			fmt.Fprintf(&b, " page %d", f.Page)
		}
		if f.DiskPage >= 0 {
			fmt.Fprintf(&b, " disk page %d", f.DiskPage)
		}
		b.WriteString(": ")
	}
	if f.LSN != 0 {
		fmt.Fprintf(&b, "LSN %d: ", f.LSN)
	}
	b.WriteString(f.What)
	return b.String()
}

// CheckReport is what Check found in a store's directory.
type CheckReport struct {
	Dir string
	// CheckpointLSN and SyncedLSN are the meta file's.
	CheckpointLSN uint64
	SyncedLSN     uint64
	// Tables is the number of tables in the meta file and created by the WAL after it
	// (dropped ones included until a checkpoint removes them).
	Tables int
	// Pages is the number of mapped logical pages whose disk pages were read and checked;
	// Rows the rows their page-map entries hold.
	Pages uint64
	Rows  uint64
	// DiskPages is the number of whole disk pages in the data files; FreeDiskPages those no
	// page-map entry maps (free: the next checkpoints reuse them, lowest first).
	DiskPages     uint64
	FreeDiskPages uint64
	// WALSegments and WALRecords count the segments and good records the WAL check read
	// (those wholly at or below the checkpoint LSN included), WALBytes the bytes recovery
	// reads (after them); LastLSN is the last good record.
	WALSegments int
	WALRecords  uint64
	WALBytes    int64
	LastLSN     uint64
	// Findings are the damage and notes found, in the order found; Omitted counts those
	// beyond CheckOptions.MaxFindings.
	Findings []Finding
	Omitted  int
	// damage counts every damage finding, kept or omitted.
	damage int
}

// Damaged reports whether Check found any damage (notes do not count).
func (r *CheckReport) Damaged() bool { return r.damage > 0 }

// DamageCount returns the number of damage findings, including omitted ones.
func (r *CheckReport) DamageCount() int { return r.damage }

func (r *CheckReport) add(max int, f Finding) {
	if f.Damage {
		r.damage++
	}
	if len(r.Findings) >= max {
		r.Omitted++
		return
	}
	r.Findings = append(r.Findings, f)
}

// checker is the state of one Check.
type checker struct {
	ctx         context.Context
	fs          vfs.FS // read-only
	dir         string
	maxFindings int
	rep         *CheckReport
	meta        *metaState
	cat         checkCatalog
}

// Check checks the stopped store in dir without changing it (see the comment at the top of
// check.go for what it checks) and returns what it found: the store is intact when
// !report.Damaged(). The error is for a check that could not run: ErrLocked when another
// process (or an open Engine of this one) holds the directory, ErrOldFormat, ErrNotStore, an
// IO error, ctx's error when ctx ends first; damage is never an error. Any goroutine may call
// it; it takes as long as reading the meta file, the data files' mapped pages and the WAL.
func Check(ctx context.Context, dir string, opts CheckOptions) (*CheckReport, error) {
	fsys := opts.FS
	if fsys == nil {
		fsys = vfs.Default
	}
	c := &checker{ctx: ctx, fs: vfs.ReadOnly(fsys), dir: dir, maxFindings: opts.MaxFindings,
		rep: &CheckReport{Dir: dir}}
	if c.maxFindings <= 0 {
		c.maxFindings = 1000
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("storenode: check %s: %w", dir, err)
	}
	names, err := c.fs.List(dir)
	if err != nil {
		if isNotExist(err) {
			return nil, fmt.Errorf("%w: %s: %w", ErrNotStore, dir, err)
		}
		return nil, fmt.Errorf("storenode: check %s: %w", dir, err)
	}
	if _, walErr := c.fs.List(walDir(dir)); !contains(names, metaName) && walErr != nil {
		return nil, fmt.Errorf("%w: %s (no meta file, no wal directory)", ErrNotStore, dir)
	}
	unlock, unlocked, err := c.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	rep, err := c.run()
	if err != nil {
		return nil, err
	}
	// A lock file that did not exist could not be taken (taking it would create it): an
	// Open that began meanwhile made it, and may have changed what was read.
	for _, name := range unlocked {
		if f, err := c.fs.Open(name); err == nil {
			_ = f.Close()
			return nil, fmt.Errorf("%w: %s: opened during the check (it had no lock file to hold), so the check saw its files change; stop it and check again",
				ErrLocked, dir)
		}
	}
	return rep, nil
}

// run is Check under the store's lock.
func (c *checker) run() (*CheckReport, error) {
	dir := c.dir
	// List again under the lock: a process may have stopped (or made the store) meanwhile.
	names, err := c.fs.List(dir)
	if err != nil {
		return nil, fmt.Errorf("storenode: check %s: %w", dir, err)
	}
	walNames, walErr := c.fs.List(walDir(dir))
	if contains(names, backupIncompleteName) {
		c.damage(Finding{File: backupIncompleteName, Offset: -1,
			What: "a backup into this directory did not finish: Open refuses it (ErrBackupIncomplete); take the backup again"})
	}
	if contains(names, restoredName) {
		c.note(Finding{File: restoredName, Offset: -1,
			What: "a restored backup not opened yet: its first Open bumps every table's ownership epoch (fencing the original's holders) and removes this marker"})
	}

	m, ok, err := loadMetaOffsets(c.fs, dir, true)
	var logDamage *mapLogDamage
	switch {
	case errors.Is(err, ErrOldFormat):
		return nil, fmt.Errorf("storenode: check %s: %w", dir, err)
	case errors.As(err, &logDamage) && errors.Is(err, corrupt.ErrCorruption):
		what := strings.TrimPrefix(err.Error(), "storenode: "+path.Join(dir, logDamage.file)+": ")
		what = strings.TrimPrefix(what, "storenode: map log: ")
		if logDamage.off >= 0 { // the finding's Offset says it
			what = strings.TrimPrefix(what, fmt.Sprintf("offset %d: ", logDamage.off))
		}
		c.damage(Finding{File: logDamage.file, Offset: logDamage.off, What: what +
			"; the page maps, data files and WAL cannot be checked without it"})
		return c.rep, nil
	case errors.Is(err, corrupt.ErrCorruption):
		what := strings.TrimPrefix(err.Error(), "storenode: "+path.Join(dir, metaName)+": ")
		c.damage(Finding{File: metaName, Offset: -1, What: strings.TrimPrefix(what, "storenode: meta: ") +
			"; the page maps, data files and WAL cannot be checked without it"})
		return c.rep, nil
	case err != nil:
		return nil, fmt.Errorf("storenode: check %s: %w", dir, err)
	case !ok:
		if hasWALSegments(walNames) {
			c.damage(Finding{File: metaName, Offset: -1, What: "the meta file is missing but the WAL holds records"})
		} else if files := dataFiles(names); len(files) > 0 {
			c.damage(Finding{File: metaName, Offset: -1, What: fmt.Sprintf("the meta file is missing but %d data files exist (%s): their page maps are lost",
				len(files), strings.Join(files[:min(len(files), 4)], ", "))})
		} else {
			c.note(Finding{File: metaName, Offset: -1, What: "no meta file and no WAL records: a store never opened (Open makes an empty one)"})
		}
		return c.rep, nil
	}
	c.meta = m
	c.rep.CheckpointLSN, c.rep.SyncedLSN = m.ckptLSN, m.syncedLSN
	if contains(names, metaTempName) {
		c.note(Finding{File: metaTempName, Offset: -1, What: "a checkpoint that was not published (Open ignores and overwrites it)"})
	}
	if err := c.noteMapLogs(names, m); err != nil {
		return nil, err
	}
	if err := c.checkTxnState(names, m); err != nil {
		return nil, err
	}
	c.cat.init(m)
	offs := metaTableOffsets(m)
	byName := make(map[string]uint32, len(m.tables))
	for i := range m.tables {
		mt := &m.tables[i]
		if other, ok := byName[mt.name]; ok {
			c.damage(Finding{File: metaName, Offset: offs[i], Table: mt.id, Page: -1, DiskPage: -1,
				What: fmt.Sprintf("table %d is named %q, as table %d: a name opens one table, so the other's rows are out of reach", mt.id, mt.name, other)})
			continue
		}
		byName[mt.name] = mt.id
	}
	for i := range m.tables {
		if err := c.checkTable(&m.tables[i], offs[i]); err != nil {
			return nil, err
		}
	}
	if err := c.checkWAL(walErr); err != nil {
		return nil, err
	}
	c.checkOrphans(names)
	if contains(names, restoredName) {
		c.checkRestoreBump()
	}
	c.rep.Tables = len(c.cat.tables)
	return c.rep, nil
}

// checkRestoreBump reports the live tables whose epoch the first Open of a restored copy
// cannot bump by restoreEpochGap (finishRestore refuses to wrap it, and so the Open).
func (c *checker) checkRestoreBump() {
	ids := make([]uint32, 0, len(c.cat.tables))
	for id, t := range c.cat.tables {
		if t.live && !t.cluster && t.epoch > ^uint64(0)-restoreEpochGap {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		t := c.cat.tables[id]
		c.damage(Finding{File: restoredName, Offset: -1, Table: id, Page: -1, DiskPage: -1,
			What: fmt.Sprintf("table %q has epoch %d, which the first Open of a restored copy cannot bump by %d: Open refuses the store",
				t.name, t.epoch, uint64(restoreEpochGap))})
	}
}

// lock takes the store's lock and the WAL's, read-only: an Engine holds both while it runs. A
// lock file that does not exist (a copy made without it) is not taken: it is returned in
// absent, and Check fails if it exists once the check is done.
func (c *checker) lock() (unlock func(), absent []string, err error) {
	var held []io.Closer
	unlock = func() {
		for _, l := range held {
			_ = l.Close()
		}
	}
	for _, name := range []string{path.Join(c.dir, "LOCK"), path.Join(walDir(c.dir), "LOCK")} {
		l, err := c.fs.Lock(name)
		switch {
		case err == nil:
			held = append(held, l)
		case errors.Is(err, vfs.ErrLockedInProcess):
			unlock()
			return nil, nil, fmt.Errorf("%w: %s: an engine of this process has it open; stop it before checking",
				ErrAlreadyOpen, c.dir)
		case errors.Is(err, vfs.ErrLocked):
			unlock()
			return nil, nil, fmt.Errorf("%w: %s: a running storage node or embedded store has it open; stop it before checking",
				ErrLocked, c.dir)
		case isNotExist(err):
			absent = append(absent, name)
		default:
			unlock()
			return nil, nil, fmt.Errorf("storenode: check %s: lock %s: %w", c.dir, name, err)
		}
	}
	return unlock, absent, nil
}

func (c *checker) damage(f Finding) { f.Damage = true; c.fill(&f); c.rep.add(c.maxFindings, f) }
func (c *checker) note(f Finding)   { f.Damage = false; c.fill(&f); c.rep.add(c.maxFindings, f) }

// fill defaults the "none" fields a finding did not set: Page and DiskPage are -1 unless
// the finding names a table.
func (c *checker) fill(f *Finding) {
	if f.Table == 0 {
		f.Page, f.DiskPage = -1, -1
	}
}

// checkWAL checks the WAL after the checkpoint with the WAL's recovery rules, replaying the
// catalog records (checkCatalog), then the page LSNs against its end.
func (c *checker) checkWAL(listErr error) error {
	dir := walDir(c.dir)
	if listErr != nil {
		if !isNotExist(listErr) {
			return fmt.Errorf("storenode: check %s: %w", c.dir, listErr)
		}
		if c.meta.ckptLSN > 0 {
			c.damage(Finding{File: "wal", Offset: -1, What: fmt.Sprintf("the WAL directory is missing, but records through LSN %d were durable", c.meta.ckptLSN)})
		} else {
			c.note(Finding{File: "wal", Offset: -1, What: "no WAL directory (Open makes one)"})
		}
		return nil
	}
	after, durable, replica := c.meta.ckptLSN, c.meta.syncedLSN, c.meta.txnState != 0
	if replica {
		after, durable = 0, 0 // a replica's WAL holds no engine record, as Open reads it (recover)
	}
	res, err := wal.Check(c.fs, dir, wal.Options{After: after, DurableThrough: durable, MaxRecordBytes: walRecordBytesMax},
		func(rec wal.Record, at wal.Position) error {
			if replica {
				c.damage(Finding{File: path.Join("wal", at.File), Offset: at.Offset, LSN: rec.LSN,
					What: fmt.Sprintf("a record of kind %d in a replica's WAL, which holds none: Open refuses it", rec.Kind)})
				return nil
			}
			if rec.Kind == kindCommitV1 {
				return oldCommitRecordError(rec.LSN) // as Open: not damage, an old format
			}
			c.cat.record(c, rec, path.Join("wal", at.File), at.Offset)
			if rec.LSN%checkCtxEvery == 0 {
				return c.ctx.Err()
			}
			return nil
		})
	c.rep.WALSegments, c.rep.WALRecords = res.Segments+res.OldSegments, res.Records+res.OldRecords
	c.rep.WALBytes, c.rep.LastLSN = res.Bytes, res.LastLSN
	for _, o := range res.OldBad {
		c.note(Finding{File: path.Join("wal", o.File), Offset: o.Offset, LSN: o.LSN,
			What: fmt.Sprintf("%v, in a segment wholly at or below the checkpoint LSN %d: recovery does not read it and the next checkpoint deletes it",
				o.Cause, c.meta.ckptLSN)})
	}
	switch {
	case errors.Is(err, corrupt.ErrCorruption):
		f := Finding{Offset: -1, LSN: res.Bad.LSN, What: err.Error()}
		if res.Bad.File != "" {
			f.File, f.Offset = path.Join("wal", res.Bad.File), res.Bad.Offset
		} else {
			f.File = "wal"
		}
		c.damage(f)
		return nil // the page maps cannot be held against a log that ends early
	case err != nil:
		return fmt.Errorf("storenode: check %s: %w", c.dir, err)
	}
	if err := c.ctx.Err(); err != nil {
		return fmt.Errorf("storenode: check %s: %w", c.dir, err)
	}
	if t := res.Tail; t != nil {
		what := fmt.Sprintf("torn tail: the record due here is bad (%v); Open drops these %d bytes", t.Cause, t.Bytes)
		if len(t.Removed) > 0 {
			what += fmt.Sprintf(" and the later segments %s", strings.Join(t.Removed, ", "))
		}
		c.note(Finding{File: path.Join("wal", t.File), Offset: t.Offset, LSN: t.LSN,
			What: what + ": writes after the last sync that a crash cut (never acknowledged under sync=always)"})
	}
	if replica {
		res.LastLSN = c.meta.ckptLSN // the group's log re-delivers what follows
	}
	c.checkAfterWAL(res.LastLSN)
	return nil
}

// checkOrphans notes data files no table owns: recovery removes them.
func (c *checker) checkOrphans(names []string) {
	for _, n := range names {
		idText, ok := strings.CutPrefix(n, "table-")
		if !ok {
			continue
		}
		idText, ok = strings.CutSuffix(idText, ".dat")
		id, err := strconv.ParseUint(idText, 10, 32)
		if !ok || err != nil || c.cat.tables[uint32(id)] != nil {
			continue
		}
		c.note(Finding{File: n, Offset: -1, What: "data file of no table (dropped and checkpointed, or created by a lost WAL tail): Open removes it"})
	}
}

func contains(names []string, name string) bool {
	for _, n := range names {
		if n == name {
			return true
		}
	}
	return false
}

// noteMapLogs notes the map logs the meta file m does not name and bytes beyond the published
// length of the one it names: what an unpublished checkpoint leaves, which Open removes.
func (c *checker) noteMapLogs(names []string, m *metaState) error {
	for _, n := range names {
		gen, ok := parseMapLogName(n)
		if !ok {
			continue
		}
		if gen != m.logGen {
			c.note(Finding{File: n, Offset: -1, What: "a map log the meta file does not name: a compaction not published, or an old log not removed (Open removes it)"})
			continue
		}
		f, err := c.fs.Open(path.Join(c.dir, n))
		if err != nil {
			return fmt.Errorf("storenode: check %s: %w", c.dir, err)
		}
		size, err := f.Size()
		f.Close()
		if err != nil {
			return fmt.Errorf("storenode: check %s: size of %s: %w", c.dir, n, err)
		}
		if size > int64(m.logLen) {
			c.note(Finding{File: n, Offset: int64(m.logLen), What: fmt.Sprintf("%d bytes beyond the published length: a checkpoint not published (Open truncates them)", size-int64(m.logLen))})
		}
	}
	return nil
}
