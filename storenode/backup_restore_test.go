package storenode

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/testseed"
	"github.com/weftdb/weft/internal/vfs"
)

// TestBackupOverlappingHoldsFreePages: disk pages a checkpoint replaced while backup B1 held
// its snapshot are needed by B1 only; once B1 ends, a later backup B2 (whose snapshot was
// taken after the replacement) must not keep them. Otherwise backups that overlap one another
// (a long backup started every half hour) keep every replaced page, and every dropped
// table's file, from reuse for ever. B2's copy stays right while the freed pages are reused.
// On 71787ea the 16 pages stayed held until B2 ended (and the dropped table's file stayed).
func TestBackupOverlappingHoldsFreePages(t *testing.T) {
	e := openTest(t, Options{Sync: SyncNone})
	ti, g := ownedTable(t, e, "items", 64, testOwner, 16)
	fences := []base.Fence{{Table: ti.ID, Epoch: g.Epoch}}
	seq := uint64(0)
	commitAll := func(v uint64) { commitRows(t, e, &seq, ti.ID, fences, v) }
	gone, err := e.CreateTable("gone", 64)
	require.NoError(t, err)
	commitAll(0)
	require.NoError(t, e.Checkpoint())

	// B1 holds the first snapshot.
	ctx1, cancel1 := context.WithCancel(context.Background())
	defer cancel1()
	done1 := startBlockedBackup(ctx1, e)
	commitAll(10_000)
	require.NoError(t, e.DropTable("gone", testOwner))
	require.NoError(t, e.Checkpoint())
	_, held := e.BackupHold()
	require.Equal(t, 16, held)

	// B2's snapshot comes after that checkpoint: it maps none of the held pages.
	dir := filepath.Join(t.TempDir(), "copy")
	d, err := NewBackupDir(nil, dir)
	require.NoError(t, err)
	defer d.Close()
	s2 := &hookSink{d: d, hook: func(f BackupFile) {
		if f.Kind != BackupData {
			return
		}
		cancel1()
		<-done1
		n, held := e.BackupHold()
		require.Equal(t, 1, n)
		require.Zero(t, held, "pages only the ended backup needed are still kept from reuse")
		// The freed pages are reused now, under B2: its copy must not notice.
		commitAll(20_000)
		require.NoError(t, e.Checkpoint())
		_, err := e.fs.Open(dataFileName(e.dir, gone.ID))
		require.True(t, isNotExist(err), "the dropped table's file is kept, though no running backup copies it: %v", err)
		commitAll(30_000)
		require.NoError(t, e.Checkpoint())
	}}
	info, err := e.Backup(context.Background(), s2)
	require.NoError(t, err)
	require.NoError(t, d.Finish(info))
	n, held := e.BackupHold()
	require.Zero(t, n)
	require.Zero(t, held)

	c := openTest(t, Options{Dir: dir})
	for id := range uint64(1024) {
		row, ok := readRow(t, c, ti.ID, id)
		require.True(t, ok, "row %d", id)
		require.Equal(t, row64(30_000+id), row, "row %d", id)
	}
}

// TestCheckBackupMarkers: Check (weft verify) reports a backup directory that was never
// finished as damage, since Open refuses it, and a finished copy not yet opened with a note
// (its first Open bumps every epoch). On 71787ea Check called an unfinished backup intact
// (exit 0 from weft verify) while Open refused it with ErrBackupIncomplete.
func TestCheckBackupMarkers(t *testing.T) {
	e := openTest(t, Options{})
	ti, g := ownedTable(t, e, "items", 64, testOwner, 1)
	commitWait(t, e, &base.Batch{Owner: testOwner, Seq: 1, Fences: []base.Fence{{Table: ti.ID, Epoch: g.Epoch}},
		Segments: []base.Segment{oneRow(ti.ID, 3, row64(33))}})

	dir := filepath.Join(t.TempDir(), "copy")
	d, err := NewBackupDir(nil, dir)
	require.NoError(t, err)
	info, err := e.Backup(context.Background(), d)
	require.NoError(t, err)
	require.NoError(t, d.Close()) // every file is there, but Finish never ran
	_, err = Open(Options{Dir: dir})
	require.ErrorIs(t, err, ErrBackupIncomplete)
	rep := requireChecked(t, context.Background(), dir, CheckOptions{})
	require.True(t, rep.Damaged(), "Check calls intact a directory Open refuses: %v", rep.Findings)
	require.Contains(t, rep.Findings[0].String(), backupIncompleteName)

	dir2, _ := backupTo(t, e)
	rep = requireChecked(t, context.Background(), dir2, CheckOptions{})
	require.False(t, rep.Damaged(), "%v", rep.Findings)
	require.Len(t, rep.Findings, 1, "%v", rep.Findings)
	require.Contains(t, rep.Findings[0].String(), restoredName)
	_ = info
}

// TestRestoreFirstOpenCrashes: a restored copy's first Open loses power at every point
// (recovery, the epoch bump's records, the marker's removal); the next Open recovers it with
// the rows, every epoch bumped at least once (the original's grant fenced) and the marker
// gone, Check finds no damage, and an Open after that bumps nothing.
func TestRestoreFirstOpenCrashes(t *testing.T) {
	e := openTest(t, Options{Sync: SyncNone})
	var grants []base.Grant
	for i, name := range []string{"a", "b"} {
		ti, err := e.CreateTable(name, 64)
		require.NoError(t, err)
		g := acquire(t, e, ti.ID, testOwner, 0)
		_, _, err = e.AllocIDs(ti.ID, testOwner, g.Epoch, 1)
		require.NoError(t, err)
		commitWait(t, e, &base.Batch{Owner: testOwner, Seq: uint64(i + 1), Fences: []base.Fence{{Table: ti.ID, Epoch: g.Epoch}},
			Segments: []base.Segment{oneRow(ti.ID, 3, row64(uint64(33+i)))}})
		grants = append(grants, g)
		if i == 0 {
			require.NoError(t, e.Checkpoint()) // a's rows in a page, b's in the WAL tail
		}
	}
	backup := func() *vfs.FaultFS {
		fs := vfs.NewFaultFS()
		d, err := NewBackupDir(fs, "copy")
		require.NoError(t, err)
		info, err := e.Backup(context.Background(), d)
		require.NoError(t, err)
		require.NoError(t, d.Finish(info))
		return fs
	}
	for _, mode := range []SyncMode{SyncAlways, SyncNone} {
		restoreFirstOpenCrashes(t, backup, grants, Options{Dir: "copy", Sync: mode, Logger: quietLogger, CheckpointInterval: -1})
	}
}

// restoreFirstOpenCrashes crashes the first open of a fresh copy (backup) at every point.
func restoreFirstOpenCrashes(t *testing.T, backup func() *vfs.FaultFS, grants []base.Grant, opts Options) {
	for k := int64(0); ; k++ {
		fs := backup()
		opts.FS = fs
		fs.SetCrashPoint(k)
		c, err := Open(opts)
		if err == nil && !fs.CrashPointReached() {
			fs.ResetFaults()
			require.NoError(t, c.Close())
			require.Greater(t, k, int64(3), "the first open finished within %d operations", k)
			return // every crash point was tried
		}
		if err == nil {
			c.Close()
		}
		fs.Crash(rand.New(rand.NewPCG(uint64(k), uint64(opts.Sync)))) // some unsynced writes survive
		msg := fmt.Sprintf("sync %v: crash after %d operations of the first open", opts.Sync, k)
		requireCheckNoDamage(t, fs, "copy", msg)
		c, err = Open(opts)
		require.NoError(t, err, msg)
		ok, err := hasFile(fs, "copy", restoredName)
		require.NoError(t, err)
		require.False(t, ok, msg)
		epochs := map[uint32]uint64{}
		for i, g := range grants {
			row, found := readRow(t, c, g.Table, 3)
			require.True(t, found, msg)
			require.Equal(t, row64(uint64(33+i)), row, msg)
			_, err := c.Acquire(g.Table, testOwner, g.Epoch)
			require.ErrorIs(t, err, ErrFenced, msg)
			c.mu.Lock()
			epochs[g.Table] = c.tables[g.Table].epoch
			c.mu.Unlock()
			require.GreaterOrEqual(t, epochs[g.Table], g.Epoch+restoreEpochGap, msg)
		}
		require.NoError(t, c.Close())
		c, err = Open(opts)
		require.NoError(t, err, msg)
		for _, g := range grants {
			c.mu.Lock()
			require.Equal(t, epochs[g.Table], c.tables[g.Table].epoch, "%s: bumped again", msg)
			c.mu.Unlock()
		}
		require.NoError(t, c.Close())
	}
}

// TestBackupOriginCrashDuringHold: the origin loses power (and, in the second run, is killed)
// while a backup holds its snapshot, after checkpoints kept replaced pages, a dropped table's
// file and WAL segments for it. It recovers with every acknowledged row, Check finds no
// damage, nothing stays held, the next checkpoints remove the dropped table's file and the
// WAL shrinks, and a backup after the restart restores right.
func TestBackupOriginCrashDuringHold(t *testing.T) {
	for _, kill := range []bool{false, true} {
		fs := vfs.NewFaultFS()
		opts := Options{Dir: "db", FS: fs, Logger: quietLogger, CheckpointInterval: -1, WALSegmentBytes: 32 << 10}
		e := openEngine(t, opts)
		ti, err := e.CreateTable("items", 64)
		require.NoError(t, err)
		gone, err := e.CreateTable("gone", 64)
		require.NoError(t, err)
		g := acquire(t, e, ti.ID, testOwner, 0)
		_, _, err = e.AllocIDs(ti.ID, testOwner, g.Epoch, 16)
		require.NoError(t, err)
		seq := uint64(0)
		commitAll := func(e *Engine, epoch, v uint64) {
			commitRows(t, e, &seq, ti.ID, []base.Fence{{Table: ti.ID, Epoch: epoch}}, v)
		}
		commitAll(e, g.Epoch, 0)
		require.NoError(t, e.Checkpoint())
		ctx, cancel := context.WithCancel(context.Background())
		done := startBlockedBackup(ctx, e)
		commitAll(e, g.Epoch, 10_000)
		require.NoError(t, e.DropTable("gone", testOwner))
		require.NoError(t, e.Checkpoint())
		commitAll(e, g.Epoch, 20_000)
		require.NoError(t, e.Checkpoint())
		_, held := e.BackupHold()
		require.Equal(t, 32, held)
		if kill {
			fs.CrashKeepAll()
		} else {
			fs.Crash(nil)
		}
		cancel()
		<-done
		e.Close()

		requireCheckNoDamage(t, fs, "db", "after the crash")
		e = openEngine(t, opts)
		n, held := e.BackupHold()
		require.Zero(t, n)
		require.Zero(t, held)
		for id := range uint64(1024) {
			row, ok := readRow(t, e, ti.ID, id)
			require.True(t, ok)
			require.Equal(t, row64(20_000+id), row)
		}
		g = acquire(t, e, ti.ID, testOwner, 0)
		commitAll(e, g.Epoch, 30_000)
		require.NoError(t, e.Checkpoint())
		commitAll(e, g.Epoch, 40_000)
		require.NoError(t, e.Checkpoint())
		_, err = fs.ReadFile(dataFileName("db", gone.ID))
		require.True(t, isNotExist(err), "the dropped table's file stays after the crash: %v", err)
		require.LessOrEqual(t, walSegments(t, e), 2, "the WAL the backup held is dropped")
		// Every page the data file holds beyond the 16 mapped ones is free again: a backup
		// now copies only those, and its copy restores right.
		dir, _ := backupTo(t, e)
		c := openTest(t, Options{Dir: dir})
		for id := range uint64(1024) {
			row, ok := readRow(t, c, ti.ID, id)
			require.True(t, ok)
			require.Equal(t, row64(40_000+id), row)
		}
		require.NoError(t, c.Close())
		require.NoError(t, e.Close())
	}
}

// TestBackupBusyBeforeCheckpoint: with four backups running, a fifth is refused with
// ErrBackupBusy before it runs the checkpoint every backup starts with, so a client asking
// again and again cannot make the store checkpoint on every request. On 71787ea each refused
// backup ran a checkpoint first.
func TestBackupBusyBeforeCheckpoint(t *testing.T) {
	e := openTest(t, Options{Sync: SyncNone})
	ti, g := ownedTable(t, e, "items", 64, testOwner, 1)
	seq := uint64(0)
	commit := func() {
		seq++
		commitWait(t, e, &base.Batch{Owner: testOwner, Seq: seq, Fences: []base.Fence{{Table: ti.ID, Epoch: g.Epoch}},
			Segments: []base.Segment{oneRow(ti.ID, 1, row64(seq))}})
	}
	commit()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, backupsMax)
	for range backupsMax {
		s := &blockSink{started: make(chan struct{}), any: true}
		go func() {
			_, err := e.Backup(ctx, s)
			done <- err
		}()
		<-s.started
	}
	commit() // something to checkpoint
	before := e.Stats().Checkpoints
	for range 3 {
		_, err := e.Backup(context.Background(), &blockSink{started: make(chan struct{}), any: true})
		require.ErrorIs(t, err, ErrBackupBusy)
	}
	require.Equal(t, before, e.Stats().Checkpoints, "a refused backup checkpointed")
	cancel()
	for range backupsMax {
		require.ErrorIs(t, <-done, context.Canceled)
	}
}

// TestRestoredTableNotKeptByFencedOwner: on a restored copy the original's owner is fenced,
// and stays connected (a game server that was not restarted: its renewals, refused, and its
// other requests go on). Its traffic must not keep the table from the node that is to take
// it over: the fenced owner can never use it again. On 71787ea the bump kept the old holder,
// so every request of the fenced owner renewed its lease on the table for ever (Renew), and
// no other owner could acquire it while the fenced one lived.
func TestRestoredTableNotKeptByFencedOwner(t *testing.T) {
	e := openTest(t, Options{Sync: SyncNone})
	ti, err := e.CreateTable("items", 64)
	require.NoError(t, err)
	g := acquire(t, e, ti.ID, testOwner, 0)
	dir, _ := backupTo(t, e)

	clock := &fakeClock{}
	c := openTest(t, Options{Dir: dir, Now: clock.Now, LeaseDuration: time.Minute})
	for range 12 { // three leases of the fenced owner's traffic
		_, err := c.Acquire(ti.ID, testOwner, g.Epoch)
		require.ErrorIs(t, err, ErrFenced)
		c.Renew(testOwner)
		clock.Advance(15 * time.Second)
	}
	other := uint64(testOwner + 1)
	g2, err := c.Acquire(ti.ID, other, 0)
	require.NoError(t, err, "the fenced owner's traffic keeps the restored table from every other owner")
	require.Greater(t, g2.Epoch, g.Epoch+restoreEpochGap)
	_, err = c.Acquire(ti.ID, testOwner, g.Epoch)
	require.ErrorIs(t, err, ErrFenced)
}

// TestBackupsOverlapUnderLoad: backups that overlap one another, with commits and checkpoints
// going on (replaced pages held, then freed as the backups that need them end, and reused
// under the later ones), each restore to an exact prefix of the committed history holding
// every batch acknowledged before it began. Batch v writes value v into two rows on two
// pages, so a copy with a page image from the wrong checkpoint, or a batch in part, shows.
func TestBackupsOverlapUnderLoad(t *testing.T) {
	batches := uint64(testseed.Scaled(600, 2400, 20000))
	e := openTest(t, Options{Sync: SyncNone, CheckpointWALBytes: 16 << 10, WALSegmentBytes: 32 << 10})
	ti, g := ownedTable(t, e, "items", 64, testOwner, 16)
	rowsOf := func(v uint64) [2]uint64 { return [2]uint64{v % 16 * 64, (v+8)%16*64 + 1} }

	var mu sync.Mutex
	cond := sync.NewCond(&mu)
	acked := uint64(0)
	committerDone := make(chan error, 1)
	go func() {
		var err error
		defer func() {
			mu.Lock()
			acked = batches + 1 // wakes every waiter for good
			cond.Broadcast()
			mu.Unlock()
			committerDone <- err
		}()
		for v := uint64(1); v <= batches; v++ {
			ids := rowsOf(v)
			_, err = e.CommitWait(&base.Batch{Owner: testOwner, Seq: v, Fences: []base.Fence{{Table: ti.ID, Epoch: g.Epoch}},
				Segments: []base.Segment{oneRow(ti.ID, ids[0], row64(v)), oneRow(ti.ID, ids[1], row64(v))}})
			if err != nil {
				return
			}
			if v%97 == 0 {
				if err = e.Checkpoint(); err != nil {
					return
				}
			}
			mu.Lock()
			acked = v
			cond.Broadcast()
			mu.Unlock()
		}
	}()
	// waitFor blocks until n batches are acknowledged (or the committer ended).
	waitFor := func(n uint64) uint64 {
		mu.Lock()
		defer mu.Unlock()
		for acked < min(n, batches+1) {
			cond.Wait()
		}
		return acked
	}
	type copyRun struct {
		dir    string
		before uint64
	}
	const workers = 3
	var sawHeld atomic.Bool
	perWorker := testseed.Scaled(4, 8, 40)
	var runs []copyRun // guarded by mu
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			var err error
			defer func() { errs <- err }()
			for k := range perWorker {
				mu.Lock()
				before := acked
				mu.Unlock()
				if before > batches {
					return
				}
				dir := filepath.Join(t.TempDir(), fmt.Sprintf("copy-%d-%d", w, k))
				var d *BackupDir
				if d, err = NewBackupDir(nil, dir); err != nil {
					return
				}
				// Each piece waits for more commits, so backups overlap and checkpoints
				// replace the pages they hold.
				sink := sinkFunc(func(ctx context.Context, f BackupFile, off int64, b []byte) error {
					mu.Lock()
					now := acked
					mu.Unlock()
					waitFor(now + uint64(10*(w+1)))
					if _, h := e.BackupHold(); h > 0 {
						sawHeld.Store(true)
					}
					return d.WriteChunk(ctx, f, off, b)
				})
				var info BackupInfo
				info, err = e.Backup(context.Background(), sink)
				if err == nil {
					err = d.Finish(info)
				}
				d.Close()
				if err != nil {
					return
				}
				mu.Lock()
				runs = append(runs, copyRun{dir, before})
				mu.Unlock()
			}
		}()
	}
	for range workers {
		require.NoError(t, <-errs)
	}
	require.NoError(t, <-committerDone)
	n, held := e.BackupHold()
	require.Zero(t, n)
	require.Zero(t, held)

	copies := 0
	for _, r := range runs {
		copies++
		c := openTest(t, Options{Dir: r.dir})
		last := map[uint64]uint64{} // row id -> value in the copy (0: absent)
		top := uint64(0)
		for p := uint64(0); p < 16; p++ {
			for _, id := range []uint64{p * 64, p*64 + 1} {
				row, ok := readRow(t, c, ti.ID, id)
				if ok {
					last[id] = binary.LittleEndian.Uint64(row)
					require.Equal(t, row64(last[id]), row)
					top = max(top, last[id])
				}
			}
		}
		require.GreaterOrEqual(t, top, r.before, "%s: a batch acknowledged before the backup began is missing", r.dir)
		want := map[uint64]uint64{}
		for v := uint64(1); v <= top; v++ {
			for _, id := range rowsOf(v) {
				want[id] = v
			}
		}
		require.Equal(t, want, last, "%s: not the prefix through batch %d", r.dir, top)
		require.NoError(t, c.Close())
	}
	require.Greater(t, copies, workers)
	t.Logf("%d copies, held pages seen: %v", copies, sawHeld.Load())
}

// sinkFunc is a BackupSink from a function.
type sinkFunc func(ctx context.Context, f BackupFile, off int64, b []byte) error

func (s sinkFunc) WriteChunk(ctx context.Context, f BackupFile, off int64, b []byte) error {
	return s(ctx, f, off, b)
}
