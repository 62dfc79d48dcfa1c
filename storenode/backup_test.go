package storenode

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/corrupt"
)

// backupTo backs e up into a new directory and finishes it.
func backupTo(t *testing.T, e *Engine) (string, BackupInfo) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "copy")
	d, err := NewBackupDir(nil, dir)
	require.NoError(t, err)
	defer d.Close()
	info, err := e.Backup(context.Background(), d)
	require.NoError(t, err)
	require.NoError(t, d.Finish(info))
	return dir, info
}

func TestBackupIdleStore(t *testing.T) {
	e := openTest(t, Options{})
	dir, info := backupTo(t, e)
	require.Equal(t, info.CheckpointLSN, info.ThroughLSN)
	c := openTest(t, Options{Dir: dir})
	require.Empty(t, c.Tables())

	// An idle store with a table and rows, checkpointed: the copy holds them, and no WAL.
	ti, g := ownedTable(t, e, "items", 64, testOwner, 1)
	commitWait(t, e, &base.Batch{Owner: testOwner, Seq: 1, Fences: []base.Fence{{Table: ti.ID, Epoch: g.Epoch}},
		Segments: []base.Segment{oneRow(ti.ID, 3, row64(33))}})
	require.NoError(t, e.Checkpoint())
	dir2, _ := backupTo(t, e)
	c2 := openTest(t, Options{Dir: dir2})
	row, ok := readRow(t, c2, ti.ID, 3)
	require.True(t, ok)
	require.Equal(t, row64(33), row)
	// The restored copy bumped the epoch: the original's grant is fenced there.
	_, err := c2.Acquire(ti.ID, testOwner, g.Epoch)
	require.ErrorIs(t, err, ErrFenced)
	_, err = c2.CommitWait(&base.Batch{Owner: testOwner, Seq: 2, Fences: []base.Fence{{Table: ti.ID, Epoch: g.Epoch}},
		Segments: []base.Segment{oneRow(ti.ID, 4, row64(44))}})
	require.ErrorIs(t, err, ErrFenced)
	g2 := acquire(t, c2, ti.ID, testOwner, 0)
	require.Greater(t, g2.Epoch, g.Epoch+restoreEpochGap-1)
	require.NoError(t, c2.Close())
	// The bump happens once: the marker is gone after the first open.
	c3 := openTest(t, Options{Dir: dir2})
	acquire(t, c3, ti.ID, testOwner, g2.Epoch)
}

// TestBackupWALTail backs up a store whose WAL after the checkpoint holds batches the copy
// must replay, written while the backup runs (the sink commits between pieces).
func TestBackupWALTail(t *testing.T) {
	e := openTest(t, Options{Sync: SyncNone, WALSegmentBytes: 64 << 10})
	ti, g := ownedTable(t, e, "items", 64, testOwner, 64)
	fences := []base.Fence{{Table: ti.ID, Epoch: g.Epoch}}
	seq := uint64(0)
	commit := func(id, v uint64) {
		seq++
		commitWait(t, e, &base.Batch{Owner: testOwner, Seq: seq, Fences: fences, Segments: []base.Segment{oneRow(ti.ID, id, row64(v))}})
	}
	for id := range uint64(2000) {
		commit(id, id)
	}
	dir := filepath.Join(t.TempDir(), "copy")
	d, err := NewBackupDir(nil, dir)
	require.NoError(t, err)
	s := &hookSink{d: d, hook: func(f BackupFile) {
		if f.Kind == BackupData {
			// Overwrite rows and checkpoint while the data pages stream: replaced disk pages
			// must not be reused under the backup.
			for id := range uint64(2000) {
				commit(id, id+1_000_000)
			}
			require.NoError(t, e.Checkpoint())
			for id := range uint64(500) {
				commit(id, id+2_000_000)
			}
			require.NoError(t, e.Checkpoint())
		}
	}}
	info, err := e.Backup(context.Background(), s)
	require.NoError(t, err)
	require.NoError(t, d.Finish(info))
	require.Greater(t, info.ThroughLSN, info.CheckpointLSN)
	n, held := e.BackupHold()
	require.Zero(t, n)
	require.Zero(t, held)

	c := openTest(t, Options{Dir: dir})
	for id := range uint64(2000) {
		row, ok := readRow(t, c, ti.ID, id)
		require.True(t, ok, "row %d", id)
		want := id + 1_000_000
		if id < 500 {
			want = id + 2_000_000
		}
		require.Equal(t, row64(want), row, "row %d", id)
	}
}

// hookSink passes pieces to d and calls hook once before each new file's first piece.
type hookSink struct {
	d    *BackupDir
	hook func(BackupFile)
	seen map[BackupFile]bool
}

func (s *hookSink) WriteChunk(ctx context.Context, f BackupFile, off int64, b []byte) error {
	if s.seen == nil {
		s.seen = map[BackupFile]bool{}
	}
	if !s.seen[f] {
		s.seen[f] = true
		if s.hook != nil {
			s.hook(f)
		}
	}
	return s.d.WriteChunk(ctx, f, off, b)
}

// blockSink blocks its first data piece until ctx is done, telling started.
type blockSink struct {
	started chan struct{}
	any     bool // block on the first piece of any file
	once    sync.Once
}

func (s *blockSink) WriteChunk(ctx context.Context, f BackupFile, off int64, b []byte) error {
	if f.Kind != BackupData && !s.any {
		return nil
	}
	s.once.Do(func() { close(s.started) })
	<-ctx.Done()
	return ctx.Err()
}

// startBlockedBackup starts a Backup of e under ctx into a blockSink that blocks on the first
// piece of a data file, and returns once it blocks; the channel gets the Backup's error.
func startBlockedBackup(ctx context.Context, e *Engine) <-chan error {
	s := &blockSink{started: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		_, err := e.Backup(ctx, s)
		done <- err
	}()
	<-s.started
	return done
}

// commitRows commits rows 0 to 1023 of table, row id holding row64(v+id), one batch each
// under fences, the batches numbered on from *seq; each is durable before the next.
func commitRows(t *testing.T, e *Engine, seq *uint64, table uint32, fences []base.Fence, v uint64) {
	t.Helper()
	for id := range uint64(1024) {
		*seq++
		commitWait(t, e, &base.Batch{Owner: testOwner, Seq: *seq, Fences: fences, Segments: []base.Segment{oneRow(table, id, row64(v+id))}})
	}
}

// TestBackupAbandonedReleasesHold: a backup whose sink stalls holds replaced disk pages and
// WAL segments; cancelling it (the client went away) frees them, and checkpoints go on
// dropping the WAL.
func TestBackupAbandonedReleasesHold(t *testing.T) {
	e := openTest(t, Options{Sync: SyncNone, WALSegmentBytes: 32 << 10})
	ti, g := ownedTable(t, e, "items", 64, testOwner, 16)
	fences := []base.Fence{{Table: ti.ID, Epoch: g.Epoch}}
	seq := uint64(0)
	commitAll := func(v uint64) { commitRows(t, e, &seq, ti.ID, fences, v) }
	commitAll(0)
	require.NoError(t, e.Checkpoint())

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := startBlockedBackup(ctx, e)
	commitAll(10_000)
	require.NoError(t, e.Checkpoint())
	n, held := e.BackupHold()
	require.Equal(t, 1, n)
	require.Equal(t, 16, held, "the 16 replaced disk pages are kept")
	require.Greater(t, walSegments(t, e), 3, "no WAL segment the backup needs is dropped")

	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	n, held = e.BackupHold()
	require.Zero(t, n)
	require.Zero(t, held)
	commitAll(20_000)
	require.NoError(t, e.Checkpoint())
	require.LessOrEqual(t, walSegments(t, e), 2, "checkpoints drop the WAL again")
}

// TestBackupTimeoutReleasesHold: a sink that stalls past BackupTimeout fails the backup with
// ErrBackupTimeout and the hold ends.
func TestBackupTimeoutReleasesHold(t *testing.T) {
	e := openTest(t, Options{BackupTimeout: 200 * time.Millisecond})
	_, err := e.CreateTable("items", 64)
	require.NoError(t, err)
	s := &blockSink{started: make(chan struct{}), any: true}
	_, err = e.Backup(context.Background(), s)
	require.ErrorIs(t, err, ErrBackupTimeout)
	n, _ := e.BackupHold()
	require.Zero(t, n)
}

func walSegments(t *testing.T, e *Engine) int {
	names, err := e.fs.List(walDir(e.dir))
	require.NoError(t, err)
	n := 0
	for _, name := range names {
		if filepath.Ext(name) == ".log" {
			n++
		}
	}
	return n
}

func TestBackupIncompleteRefused(t *testing.T) {
	e := openTest(t, Options{})
	dir := filepath.Join(t.TempDir(), "copy")
	d, err := NewBackupDir(nil, dir)
	require.NoError(t, err)
	_, err = e.Backup(context.Background(), d)
	require.NoError(t, err)
	require.NoError(t, d.Close()) // no Finish
	_, err = Open(Options{Dir: dir})
	require.ErrorIs(t, err, ErrBackupIncomplete)
	// Not into a directory that holds files.
	_, err = NewBackupDir(nil, e.dir)
	require.Error(t, err)
}

func TestBackupDirRefusesBadPieces(t *testing.T) {
	ctx := context.Background()
	d, err := NewBackupDir(nil, filepath.Join(t.TempDir(), "copy"))
	require.NoError(t, err)
	defer d.Close()
	for _, f := range []BackupFile{{Kind: 0}, {Kind: 9}, {Kind: BackupMeta, Num: 1}, {Kind: BackupData, Num: 0},
		{Kind: BackupData, Num: 1 << 32}, {Kind: BackupWAL, Num: 0}} {
		require.ErrorIs(t, d.WriteChunk(ctx, f, 0, nil), ErrMalformed, "%+v", f)
	}
	meta := BackupFile{Kind: BackupMeta}
	require.ErrorIs(t, d.WriteChunk(ctx, meta, 5, []byte("x")), ErrMalformed, "a file must start at 0")
	require.NoError(t, d.WriteChunk(ctx, meta, 0, []byte("abc")))
	require.ErrorIs(t, d.WriteChunk(ctx, meta, 1, []byte("x")), ErrMalformed, "pieces in order")
	require.ErrorIs(t, d.WriteChunk(ctx, meta, 3, make([]byte, BackupChunkMax+1)), ErrMalformed)
	require.ErrorIs(t, d.WriteChunk(ctx, meta, backupFileBytesMax+1, []byte("x")), ErrMalformed)
	require.NoError(t, d.WriteChunk(ctx, BackupFile{Kind: BackupData, Num: 1}, 0, nil))
	require.ErrorIs(t, d.WriteChunk(ctx, meta, 0, nil), ErrMalformed, "a file sent twice")
}

// TestBackupCorruptPageFails: a damaged data page fails the backup; it is never copied.
func TestBackupCorruptPageFails(t *testing.T) {
	e := openTest(t, Options{})
	ti, g := ownedTable(t, e, "items", 64, testOwner, 1)
	commitWait(t, e, &base.Batch{Owner: testOwner, Seq: 1, Fences: []base.Fence{{Table: ti.ID, Epoch: g.Epoch}},
		Segments: []base.Segment{oneRow(ti.ID, 3, row64(33))}})
	require.NoError(t, e.Checkpoint())
	e.mu.Lock()
	tb := e.tables[ti.ID]
	disk := tb.pages.get(0).disk
	e.mu.Unlock()
	_, err := tb.data.WriteAt([]byte{0xff}, int64(disk-1)*int64(tb.geo.DiskPageBytes())+7)
	require.NoError(t, err)
	d, err := NewBackupDir(nil, filepath.Join(t.TempDir(), "copy"))
	require.NoError(t, err)
	defer d.Close()
	_, err = e.Backup(context.Background(), d)
	require.ErrorIs(t, err, corrupt.ErrCorruption)
	require.False(t, errors.Is(err, ErrBackupTimeout))
}

// TestBackupDuringCatalogChanges: a table dropped while its pages stream keeps its data file
// until the backup is done (the copy holds it, dropped by its replayed WAL), and a table
// created meanwhile comes back from the copied WAL.
func TestBackupDuringCatalogChanges(t *testing.T) {
	e := openTest(t, Options{Sync: SyncNone})
	next := uint64(0)
	mk := func(name string, v uint64) base.TableInfo {
		ti, err := e.CreateTable(name, 64)
		require.NoError(t, err)
		g := acquire(t, e, ti.ID, testOwner, 0)
		_, _, err = e.AllocIDs(ti.ID, testOwner, g.Epoch, 4)
		require.NoError(t, err)
		next++
		var segs []base.Segment
		for id := range uint64(200) {
			segs = append(segs, oneRow(ti.ID, id, row64(v+id)))
		}
		commitWait(t, e, &base.Batch{Owner: testOwner, Seq: next, Fences: []base.Fence{{Table: ti.ID, Epoch: g.Epoch}}, Segments: segs})
		return ti
	}
	keep := mk("keep", 0)
	gone := mk("gone", 1000)
	require.NoError(t, e.Checkpoint())
	dir := filepath.Join(t.TempDir(), "copy")
	d, err := NewBackupDir(nil, dir)
	require.NoError(t, err)
	var late base.TableInfo
	s := &hookSink{d: d, hook: func(f BackupFile) {
		if f.Kind == BackupData && f.Num == uint64(keep.ID) {
			require.NoError(t, e.DropTable("gone", testOwner))
			late = mk("late", 5000)
			require.NoError(t, e.Checkpoint()) // would remove gone's data file
			require.NoError(t, e.Checkpoint())
		}
	}}
	info, err := e.Backup(context.Background(), s)
	require.NoError(t, err)
	require.NoError(t, d.Finish(info))
	c := openTest(t, Options{Dir: dir})
	names := map[string]bool{}
	for _, ti := range c.Tables() {
		names[ti.Name] = true
	}
	require.Equal(t, map[string]bool{"keep": true, "late": true}, names)
	for id := range uint64(200) {
		row, ok := readRow(t, c, late.ID, id)
		require.True(t, ok)
		require.Equal(t, row64(5000+id), row)
		row, ok = readRow(t, c, keep.ID, id)
		require.True(t, ok)
		require.Equal(t, row64(id), row)
	}
	// After the backup the original removes the dropped table's file at a checkpoint.
	mk("after", 9000)
	require.NoError(t, e.Checkpoint())
	_, err = e.fs.Open(dataFileName(e.dir, gone.ID))
	require.True(t, isNotExist(err), "%v", err)
}
