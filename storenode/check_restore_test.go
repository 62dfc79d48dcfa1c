package storenode

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/checksum"
	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/internal/vfs"
)

// Review of Check: states where its verdict and Open's disagreed, and a check that did not
// hold the store it read.

// TestCheckIncompleteBackupIsDamage: a directory a backup did not finish (its marker still
// there) is refused by Open whatever its files hold; Check passed it as intact.
func TestCheckIncompleteBackupIsDamage(t *testing.T) {
	s := buildCheckStores(t)
	dir := copyStore(t, s.clean)
	writeTestFile(t, filepath.Join(dir, backupIncompleteName), nil)
	_, err := Open(checkTestOptions(dir))
	require.ErrorIs(t, err, ErrBackupIncomplete)

	rep := runCheck(t, dir)
	requireOnly(t, rep, Finding{Damage: true, File: backupIncompleteName, Offset: -1, Page: -1, DiskPage: -1},
		"did not finish", "Open refuses")
}

// TestCheckRestoredCopyUnchanged: a finished restore (marker RESTORED, no lock files) checks
// clean, is noted as restored, and Check neither bumps its epochs nor removes the marker; its
// first Open then does both.
func TestCheckRestoredCopyUnchanged(t *testing.T) {
	s := buildCheckStores(t)
	e := openEngine(t, checkTestOptions(copyStore(t, s.clean)))
	dst := filepath.Join(t.TempDir(), "restored")
	bd, err := NewBackupDir(nil, dst)
	require.NoError(t, err)
	info, err := e.Backup(context.Background(), bd)
	require.NoError(t, err)
	require.NoError(t, bd.Finish(info))
	require.NoError(t, bd.Close())
	require.NoError(t, e.Close())

	rep := runCheck(t, dst)
	require.False(t, rep.Damaged(), "%v", rep.Findings)
	var noted bool
	for _, f := range rep.Findings {
		noted = noted || f.File == restoredName && strings.Contains(f.What, "epoch")
	}
	require.True(t, noted, "a restored copy is noted: %v", rep.Findings)
	_, err = os.Stat(filepath.Join(dst, restoredName))
	require.NoError(t, err)

	r := openEngine(t, checkTestOptions(dst))
	require.NoError(t, r.Close())
	_, err = os.Stat(filepath.Join(dst, restoredName))
	require.ErrorIs(t, err, os.ErrNotExist)
	require.False(t, runCheck(t, dst).Damaged())
}

// TestCheckRacingOpenOfLocklessCopy: a copy of a store without its lock files (a restored
// backup, a copy made with cp) cannot be locked without writing to it; an Open that starts
// while Check reads it changed the files under Check, which reported whatever it saw. Check
// must refuse its own verdict (ErrLocked) once it sees a lock file appear.
func TestCheckRacingOpenOfLocklessCopy(t *testing.T) {
	clean, _ := buildSweepStore(t)
	files := clean.clone()
	delete(files, "db/LOCK")
	delete(files, "db/wal/LOCK")
	ffs := files.fs(t)
	var raced atomic.Bool
	ffs.Inject(func(op vfs.Op) error {
		if op.Kind != vfs.OpRead || op.Name != "db/table-00000001.dat" || !raced.CompareAndSwap(false, true) {
			return nil
		}
		// Check is reading the data file: an engine opens the store, commits and checkpoints.
		e, err := Open(Options{Dir: "db", FS: ffs, CheckpointWALBytes: -1, CheckpointInterval: -1, Logger: quietLogger,
			ExpireLeasesAtOpen: true})
		require.NoError(t, err)
		g := acquire(t, e, 1, 9, 0)
		_, _, err = e.AllocIDs(1, 9, g.Epoch, 64)
		require.NoError(t, err)
		for p := uint64(0); p < 40; p++ {
			commitWait(t, e, &base.Batch{Owner: 9, Seq: p + 1, Fences: []base.Fence{{Table: 1, Epoch: g.Epoch}},
				Segments: []base.Segment{{Table: 1, Page: p, Data: ^uint64(0), Rows: checkRows(64, 16, p, 9)}}})
		}
		require.NoError(t, e.Checkpoint())
		require.NoError(t, e.Close())
		return nil
	})
	rep, err := Check(context.Background(), "db", CheckOptions{FS: ffs})
	require.True(t, raced.Load())
	require.ErrorIs(t, err, ErrLocked, "report: %+v", rep)
	require.ErrorContains(t, err, "opened during the check")
	ffs.Inject(nil)

	// Checked again, stopped: clean.
	rep = requireChecked(t, context.Background(), "db", CheckOptions{FS: ffs})
	require.False(t, rep.Damaged(), "%v", rep.Findings)
}

// TestCheckRestoredEpochTooLarge: a restored copy whose table epoch cannot be bumped by the
// restore gap is refused by its first Open; Check passed it as intact.
func TestCheckRestoredEpochTooLarge(t *testing.T) {
	s := buildCheckStores(t)
	dir := copyStore(t, s.clean)
	editMeta(t, dir, func(m *metaState) { m.tables[1].epoch = ^uint64(0) - 5 })
	writeTestFile(t, filepath.Join(dir, restoredName), nil)
	_, err := Open(checkTestOptions(copyStore(t, dir)))
	require.ErrorContains(t, err, "cannot be bumped")

	rep := runCheck(t, dir)
	requireOnly(t, rep, Finding{Damage: true, File: restoredName, Offset: -1, Table: 2, Page: -1, DiskPage: -1},
		"cannot bump", "Open refuses")
}

// TestCheckBackupOfBusyStore: a backup taken while rows are overwritten, checkpoints replace
// disk pages, WAL segments roll and are dropped, and a table is dropped and created again
// under the same name checks clean as restored, after its first Open, and after a reopen.
func TestCheckBackupOfBusyStore(t *testing.T) {
	e := openTest(t, Options{Sync: SyncNone, WALSegmentBytes: 16 << 10, CheckpointWALBytes: -1, CheckpointInterval: -1,
		Logger: quietLogger})
	seq := uint64(0)
	mk := func(name string) (base.TableInfo, []base.Fence) {
		ti, err := e.CreateTable(name, 64)
		require.NoError(t, err)
		g := acquire(t, e, ti.ID, testOwner, 0)
		_, _, err = e.AllocIDs(ti.ID, testOwner, g.Epoch, 16)
		require.NoError(t, err)
		return ti, []base.Fence{{Table: ti.ID, Epoch: g.Epoch}}
	}
	commit := func(ti base.TableInfo, fences []base.Fence, n, v uint64) {
		for id := range n {
			seq++
			commitWait(t, e, &base.Batch{Owner: testOwner, Seq: seq, Fences: fences, Segments: []base.Segment{oneRow(ti.ID, id, row64(v+id))}})
		}
	}
	items, fi := mk("items")
	gone, fg := mk("gone")
	commit(items, fi, 600, 0)
	commit(gone, fg, 100, 0)
	require.NoError(t, e.Checkpoint())
	commit(items, fi, 300, 1000)
	dir := filepath.Join(t.TempDir(), "copy")
	d, err := NewBackupDir(nil, dir)
	require.NoError(t, err)
	s := &hookSink{d: d, hook: func(f BackupFile) {
		if f.Kind != BackupData {
			return
		}
		commit(items, fi, 600, uint64(f.Num)*5000)
		require.NoError(t, e.Checkpoint())
		if f.Num == uint64(items.ID) {
			require.NoError(t, e.DropTable("gone", testOwner))
			again, fa := mk("gone")
			commit(again, fa, 50, 77)
		}
		require.NoError(t, e.Checkpoint())
		commit(items, fi, 100, 9000)
	}}
	info, err := e.Backup(context.Background(), s)
	require.NoError(t, err)
	require.NoError(t, d.Finish(info))
	require.NoError(t, d.Close())

	rep := runCheck(t, dir)
	require.False(t, rep.Damaged(), "%v", rep.Findings)
	for range 2 {
		c := openEngine(t, checkTestOptions(dir))
		require.NoError(t, c.Close())
		rep = runCheck(t, dir)
		require.False(t, rep.Damaged(), "%v", rep.Findings)
	}
}

// forgeWALRecord appends to segment b, after the record of LSN last, a valid record of LSN
// last+1 (synced through last) of kind with payload: what a writer's bug would log.
func forgeWALRecord(b []byte, last uint64, kind byte, payload []byte) []byte {
	end := walRecordEnd(b, last)
	size := 32 + (len(payload)+7)&^7
	rec := make([]byte, size)
	binary.LittleEndian.PutUint32(rec, uint32(len(payload)))
	binary.LittleEndian.PutUint64(rec[8:], last+1)
	binary.LittleEndian.PutUint64(rec[16:], last)
	rec[24] = kind
	copy(rec[32:], payload)
	binary.LittleEndian.PutUint32(rec[4:], checksum.Update(checksum.Of(rec[:4]), rec[8:]))
	return append(b[:end:end], rec...)
}

// TestCheckAgreesWithRecoveryOnForgedRecords: a record a buggy writer could log after the
// crash image's last one. Whatever Open refuses, at once or after the checkpoint its Close
// publishes (a store that opens once and never again), Check must report as damage.
func TestCheckAgreesWithRecoveryOnForgedRecords(t *testing.T) {
	_, crash := buildSweepStore(t)
	judged := judgeStore(t, crash)
	require.False(t, judged.rep.Damaged(), "%v", judged.rep.Findings)
	last := judged.rep.LastLSN
	const segName = "db/wal/wal-0000000000000001.log"
	commit := func(owner, seq uint64, table uint32, rowBytes int, page, data uint64) []byte {
		rows := make([]byte, popcount(data)*rowBytes)
		for i := range rows {
			rows[i] = byte(i + 1)
		}
		b := &base.Batch{Owner: owner, Seq: seq, Segments: []base.Segment{{Table: table, Page: page, Data: data, Rows: rows}}}
		return appendCommitRecord(nil, b, 0, func(uint32) int { return rowBytes })
	}
	for _, c := range []struct {
		name      string
		kind      byte
		payload   []byte
		firstOpen bool // the first Open must refuse it
	}{
		{"create id 0", kindCreateTable, appendCreateRecord(nil, 0, 8, "z"), true},
		{"create a dropped id", kindCreateTable, appendCreateRecord(nil, 2, 8, "z"), false},
		{"create a live id", kindCreateTable, appendCreateRecord(nil, 3, 8, "z"), false},
		{"create a live name", kindCreateTable, appendCreateRecord(nil, 9, 8, "t"), false},
		{"create the last id", kindCreateTable, appendCreateRecord(nil, ^uint32(0), 8, "z"), true},
		{"drop a dropped table", kindDropTable, appendDropRecord(nil, 2), false},
		{"drop an unknown table", kindDropTable, appendDropRecord(nil, 99), false},
		{"grant ids beyond the last", kindGrantIDs, appendGrantIDsRecord(nil, 1, MaxRowID+1), false},
		{"grant ids of a dropped table", kindGrantIDs, appendGrantIDsRecord(nil, 2, 64), false},
		{"grant an epoch twice", kindGrantOwner, appendGrantOwnerRecord(nil, 1, 3, 1), false},
		{"grant an unknown table", kindGrantOwner, appendGrantOwnerRecord(nil, 99, 3, 5), false},
		{"commit of the wrong row size", kindCommit, commit(3, 100, 1, 8, 0, 1), false},
		{"commit beyond the last page", kindCommit, commit(3, 100, 1, 16, tablePagesMax, 1), false},
		{"commit of ungranted rows", kindCommit, commit(3, 100, 1, 16, 10, 1), true},
		{"commit to a dropped table", kindCommit, commit(3, 100, 2, 8, 0, 1), false},
		{"commit of owner 0", kindCommit, commit(0, 1, 1, 16, 0, 1), true},
		{"commit of seq 0", kindCommit, commit(11, 0, 1, 16, 0, 1), true},
		{"unknown kind", 9, []byte{1, 2, 3}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			files := crash.clone()
			files[segName] = forgeWALRecord(files[segName], last, c.kind, c.payload)
			rep := requireChecked(t, context.Background(), "db", CheckOptions{FS: files.fs(t)})
			require.EqualValues(t, last+1, rep.LastLSN, "the forged record is read: %v", rep.Findings)
			ffs := files.fs(t)
			opts := Options{Dir: "db", FS: ffs, CheckpointWALBytes: -1, CheckpointInterval: -1, Logger: quietLogger, ExpireLeasesAtOpen: true}
			e, openErr := Open(opts)
			if openErr == nil {
				require.NoError(t, e.Close())
				if e, openErr = Open(opts); openErr == nil {
					require.NoError(t, e.Close())
				}
			}
			if openErr != nil {
				require.True(t, rep.Damaged(), "Open refuses (%v), Check finds no damage: %v", openErr, rep.Findings)
			}
			if c.firstOpen {
				// Refused by the first Open, not after a checkpoint published what no
				// later Open reads.
				_, err := Open(Options{Dir: "db", FS: files.fs(t), Logger: quietLogger})
				require.ErrorIs(t, err, corrupt.ErrCorruption)
				require.ErrorContains(t, err, "replay")
			}
			t.Logf("open: %v; check: %v", openErr, rep.Findings)
		})
	}
}

// TestCheckMetaDuplicateName: two tables of the meta file with one name open (the later one
// takes the name, the other's rows are out of reach by name, and a drop by name drops one of
// them); Check passed it as intact.
func TestCheckMetaDuplicateName(t *testing.T) {
	s := buildCheckStores(t)
	dir := copyStore(t, s.clean)
	editMeta(t, dir, func(m *metaState) { m.tables[1].name = m.tables[0].name })
	m := loadTestMeta(t, dir)
	rep := runCheck(t, dir)
	requireOnly(t, rep, Finding{Damage: true, File: metaName, Offset: metaTableOffsets(m)[1], Table: 2, Page: -1, DiskPage: -1},
		`table 2 is named "items", as table 1`)
}

// TestCheckMetaLostDataFilesKept: a store whose meta file (and WAL segments) were lost but
// whose data files remain passed Check as "a store never opened", and Open made an empty meta
// file and removed every data file as an orphan: the rows were deleted. Both must refuse.
func TestCheckMetaLostDataFilesKept(t *testing.T) {
	s := buildCheckStores(t)
	dir := copyStore(t, s.clean)
	require.NoError(t, os.Remove(filepath.Join(dir, metaName)))
	segs, err := filepath.Glob(filepath.Join(dir, "wal", "*.log"))
	require.NoError(t, err)
	for _, p := range segs {
		require.NoError(t, os.Remove(p))
	}
	rep := runCheck(t, dir)
	requireOnly(t, rep, Finding{Damage: true, File: metaName, Offset: -1, Page: -1, DiskPage: -1},
		"the meta file is missing but 2 data files exist (table-00000001.dat, table-00000002.dat)")

	_, err = Open(checkTestOptions(dir))
	require.ErrorIs(t, err, corrupt.ErrCorruption)
	require.ErrorContains(t, err, "data files exist")
	_, err = os.Stat(filepath.Join(dir, "table-00000001.dat"))
	require.NoError(t, err, "Open kept the data files")
	_, err = os.Stat(filepath.Join(dir, metaName))
	require.ErrorIs(t, err, os.ErrNotExist, "and made no meta file")
}
