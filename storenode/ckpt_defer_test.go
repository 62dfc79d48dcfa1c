package storenode

import (
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/vfs"
)

// usedDiskPages counts the disk pages the engine's tables hold (published or being written).
func usedDiskPages(e *Engine) uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	var n uint64
	for _, t := range e.tables {
		n += t.used.Count()
	}
	return n
}

// Issue 22, defect 9: a checkpoint that cannot open a file for want of descriptors (EMFILE:
// a flood of idle connections to another listener of the process) is deferred, not a
// fail-stop: each open a checkpoint makes before its meta file is renamed fails in turn; the
// checkpoint returns ErrCheckpointDeferred, the engine takes commits on, the disk pages the
// abandoned checkpoint wrote are free again, the next checkpoint succeeds and a kill -9 and
// reopen finds every acknowledged batch. After the rename, the directory sync's EMFILE is
// tried again and the checkpoint succeeds. Fails on b3f6c9d, where each was a fail-stop.
func TestCheckpointOutOfFilesIsDeferred(t *testing.T) {
	cases := []struct {
		name  string
		match func(op vfs.Op) bool
	}{
		{"data-dir-sync", func(op vfs.Op) bool { return op.Kind == vfs.OpSyncDir && op.Name == "db" }},
		{"wal-open", func(op vfs.Op) bool { return op.Kind == vfs.OpOpen && strings.HasPrefix(op.Name, "db/wal/") }},
		{"wal-dir-sync", func(op vfs.Op) bool { return op.Kind == vfs.OpSyncDir && op.Name == "db/wal" }},
		{"map-log", func(op vfs.Op) bool {
			return (op.Kind == vfs.OpOpen || op.Kind == vfs.OpCreate) && strings.HasPrefix(op.Name, "db/"+mapLogPrefix)
		}},
		{"meta-create", func(op vfs.Op) bool { return op.Kind == vfs.OpCreate && strings.HasSuffix(op.Name, metaTempName) }},
	}
	for _, c := range cases {
		t.Run("fail="+c.name, func(t *testing.T) {
			// SyncNone: the checkpoint opens the WAL's segments and directory to sync them.
			s := newFailStore(t, Options{Sync: SyncNone, WALSegmentBytes: 8 << 10, CheckpointWALBytes: -1})
			require.NoError(t, s.commit(30, 4))
			require.NoError(t, s.e.Checkpoint())
			require.NoError(t, s.commit(30, 4))
			used := usedDiskPages(s.e)
			var once sync.Once
			hit := false
			s.fs.Inject(func(op vfs.Op) error {
				var err error
				if c.match(op) {
					once.Do(func() { err, hit = syscall.EMFILE, true })
				}
				return err
			})
			err := s.e.Checkpoint()
			s.fs.Inject(nil)
			require.True(t, hit, "the checkpoint made the open")
			require.ErrorIs(t, err, ErrCheckpointDeferred)
			require.ErrorIs(t, err, syscall.EMFILE)
			require.NotErrorIs(t, err, ErrFailStop)
			require.NoError(t, s.e.failure(), "no fail-stop")
			require.Equal(t, used, usedDiskPages(s.e), "the abandoned checkpoint's disk pages are free again")

			require.NoError(t, s.commit(10, 4), "commits go on")
			require.NoError(t, s.e.Checkpoint(), "the next checkpoint succeeds")
			s.reopen(nil)
			require.NoError(t, s.commit(10, 4))
			require.NoError(t, s.e.Checkpoint())
		})
	}

	t.Run("fail=meta-dir-sync-after-rename", func(t *testing.T) {
		s := newFailStore(t, Options{Sync: SyncAlways, CheckpointWALBytes: -1})
		require.NoError(t, s.commit(30, 4))
		var mu sync.Mutex
		renamed, failed := false, 0
		s.fs.Inject(func(op vfs.Op) error {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case op.Kind == vfs.OpRename && strings.HasSuffix(op.NewName, metaName):
				renamed = true
			case renamed && op.Kind == vfs.OpSyncDir && op.Name == "db" && failed < dirSyncTries-1:
				failed++
				return syscall.EMFILE
			}
			return nil
		})
		require.NoError(t, s.e.Checkpoint(), "the directory sync is tried again")
		s.fs.Inject(nil)
		require.Equal(t, dirSyncTries-1, failed)
		require.NoError(t, s.e.failure())
		require.NoError(t, s.commit(10, 4))
		s.reopen(nil)
	})
}

// The background loop tries a deferred checkpoint again, waiting ckptRetryFirst, doubling to
// ckptRetryMax while it stays deferred, then from ckptRetryFirst again after one succeeded;
// commits go on meanwhile. Fails on b3f6c9d (no retry: the first failure was a fail-stop).
func TestCheckpointLoopRetriesDeferred(t *testing.T) {
	waits := make(chan time.Duration, 1)
	fire := make(chan time.Time)
	fs := vfs.NewFaultFS()
	opts := Options{Dir: "db", FS: fs, Logger: quietLogger, Sync: SyncAlways, CheckpointInterval: -1, CheckpointWALBytes: -1,
		ckptRetryAfter: func(d time.Duration) <-chan time.Time { waits <- d; return fire }}
	e := openEngine(t, opts)
	t.Cleanup(func() { e.Close() })
	info, g := ownedTable(t, e, "a", 64, failOwner, testGrantPages)
	seq := uint64(0)
	commit := func() {
		t.Helper()
		seq++
		commitWait(t, e, &base.Batch{Owner: failOwner, Seq: seq, Fences: []base.Fence{{Table: info.ID, Epoch: g.Epoch}},
			Segments: []base.Segment{oneRow(info.ID, seq%64+1, row64(seq))}})
	}
	next := func() time.Duration {
		t.Helper()
		select {
		case d := <-waits:
			return d
		case <-time.After(10 * time.Second):
			t.Fatal("no retry scheduled")
			return 0
		}
	}
	ckpts := func() uint64 { return e.Stats().Checkpoints }

	commit()
	fs.SetOutOfFiles(true)
	before := ckpts()
	e.requestCheckpoint()
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond,
		1600 * time.Millisecond, 3200 * time.Millisecond, 5 * time.Second, 5 * time.Second}
	for i, w := range want {
		require.Equal(t, w, next(), "wait before try %d", i+2)
		commit() // the engine serves on
		require.NoError(t, e.failure())
		if i < len(want)-1 {
			fire <- time.Time{}
		}
	}
	require.Equal(t, before, ckpts(), "nothing published while out of files")

	// Descriptors back: the retry publishes, and the next deferral starts from the first wait.
	fs.SetOutOfFiles(false)
	e.mu.Lock()
	gen := e.ckptGen
	e.mu.Unlock()
	fire <- time.Time{}
	done := make(chan struct{})
	go func() {
		e.mu.Lock()
		for e.ckptGen == gen {
			e.cond.Wait()
		}
		e.mu.Unlock()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the retry did not publish")
	}
	require.Equal(t, before+1, ckpts())
	commit()
	fs.SetOutOfFiles(true)
	e.requestCheckpoint()
	require.Equal(t, ckptRetryFirst, next())
	fs.SetOutOfFiles(false)
	fire <- time.Time{}
}
