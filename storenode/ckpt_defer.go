package storenode

import (
	"fmt"
	"time"

	"github.com/weftdb/weft/internal/vfs"
)

// Deferred checkpoints. A checkpoint opens a few files beyond the data files the engine keeps
// open: the directories it syncs, the WAL segments it syncs under SyncNone, the map log and
// the meta file's temporary. A process short of descriptors (EMFILE, ENFILE: another
// listener's connections, another library's files) fails those opens with nothing wrong on
// the disk, so that is no reason to fail-stop:
//
//   - A checkpoint whose open fails for want of descriptors before the new meta file is
//     renamed into place is abandoned: nothing was published, the disk pages it wrote are
//     freed (no published map names them), its frames stay dirty, the WAL holds everything.
//     It returns ErrCheckpointDeferred wrapping the cause, and the engine goes on.
//   - The background loop tries again ckptRetryFirst later, the wait doubling up to
//     ckptRetryMax while checkpoints stay deferred; one that succeeds resets it. Commits
//     that wait for a checkpoint's room (a cache full of dirty pages) wait on meanwhile.
//   - Once renamed, the meta file is in place but not yet durable, and the old pages cannot be
//     freed: its directory sync is retried while out of descriptors, dirSyncTries times
//     dirSyncWaitFirst apart (doubling), then the engine fail-stops as for any IO error.
//   - Every other error of a checkpoint is a fail-stop, as before; so is one in replay (Open
//     fails and nothing is served).

// Waits of the deferred checkpoint's retries (checkpointLoop) and of the post-rename
// directory sync (syncDirRenamed).
const (
	ckptRetryFirst   = 100 * time.Millisecond
	ckptRetryMax     = 5 * time.Second
	dirSyncTries     = 6
	dirSyncWaitFirst = 100 * time.Millisecond
)

// deferCheckpoint abandons a checkpoint that failed with cause, a want of file descriptors,
// before its meta file was renamed: the free disk pages it took for written are given back.
// It returns ErrCheckpointDeferred wrapping cause.
func (e *Engine) deferCheckpoint(written []ckptWrite, cause error) error {
	e.mu.Lock()
	for i := range written {
		w := &written[i]
		if w.off >= 0 && w.ent.disk != 0 && e.tablesByIDAll(w.t.id) == w.t {
			w.t.used.Clear(uint64(w.ent.disk - 1))
		}
	}
	e.cond.Broadcast()
	e.mu.Unlock()
	e.opts.Logger.Warn("storenode: checkpoint deferred: out of file descriptors", "err", cause)
	return fmt.Errorf("%w: %w", ErrCheckpointDeferred, cause)
}

// syncDirRenamed syncs dir after a rename in it, trying again while the sync's open fails for
// want of file descriptors (dirSyncTries times at most): nothing was synced then.
func syncDirRenamed(fs vfs.FS, dir string) error {
	wait := dirSyncWaitFirst
	for try := 1; ; try++ {
		err := fs.SyncDir(dir)
		if err == nil || !isFileLimit(err) || try == dirSyncTries {
			return err
		}
		time.Sleep(wait)
		wait *= 2
	}
}

// ckptRetryWait is the wait before the background loop's next try after a deferred checkpoint
// whose wait was last (0: none yet).
func ckptRetryWait(last time.Duration) time.Duration {
	if last <= 0 {
		return ckptRetryFirst
	}
	return min(2*last, ckptRetryMax)
}

// ckptRetryTimer returns a channel that fires after d: Options.ckptRetryAfter in tests.
func (e *Engine) ckptRetryTimer(d time.Duration) (<-chan time.Time, func()) {
	if e.opts.ckptRetryAfter != nil {
		return e.opts.ckptRetryAfter(d), func() {}
	}
	t := time.NewTimer(d)
	return t.C, func() { t.Stop() }
}
