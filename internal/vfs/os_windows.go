package vfs

import (
	"errors"
	"os"
	"path/filepath"

	"golang.org/x/sys/windows"
)

const lockOp = "LockFileEx"

// lockFile takes an exclusive lock on the file's first byte without waiting. A LockFileEx lock
// belongs to the handle: a second Lock of the same file fails even within one process.
func lockFile(h uintptr) error {
	var ol windows.Overlapped
	return windows.LockFileEx(windows.Handle(h), windows.LOCKFILE_EXCLUSIVE_LOCK|windows.LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0, &ol)
}

// isLocked reports whether lockFile failed because another holder has the lock.
func isLocked(err error) bool {
	return errors.Is(err, windows.ERROR_LOCK_VIOLATION) || errors.Is(err, windows.ERROR_SHARING_VIOLATION)
}

// Rename is MoveFileEx(REPLACE_EXISTING|WRITE_THROUGH): it returns once the rename is on the
// disk, so SyncDir has nothing left to do for it (NTFS cannot flush a directory's entries).
func (osFS) Rename(oldname, newname string) error {
	from, err := windows.UTF16PtrFromString(filepath.FromSlash(oldname))
	if err != nil {
		return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: err}
	}
	to, err := windows.UTF16PtrFromString(filepath.FromSlash(newname))
	if err != nil {
		return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: err}
	}
	if err := windows.MoveFileEx(from, to, windows.MOVEFILE_REPLACE_EXISTING|windows.MOVEFILE_WRITE_THROUGH); err != nil {
		return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: err}
	}
	return nil
}

// SyncDir does nothing on Windows: a directory cannot be flushed there. NTFS journals its
// metadata (a created or removed entry is in the journal once the call returns) and Rename
// writes through; the storage engine's rule "an entry is durable after SyncDir" holds as far
// as NTFS's journal commits, which is what Windows offers.
func (osFS) SyncDir(dir string) error {
	if _, err := os.Stat(dir); err != nil {
		return err
	}
	return nil
}

// appendOnce appends with fstat + pwrite: Windows has no positioned append.
func (f *osFile) appendOnce(p []byte) (int, error) { return f.appendAtEnd(p) }

// Sync is FlushFileBuffers, through os.File.Sync: data and metadata reach the disk.
func (f *osFile) Sync() error {
	if err := f.f.Sync(); err != nil {
		return &os.PathError{Op: "FlushFileBuffers", Path: f.name, Err: unwrapPath(err)}
	}
	return nil
}

// Allocate does nothing on Windows: it is advisory, and a file grows as it is written.
func (f *osFile) Allocate(off, n int64) error { return nil }

// readOnlyOpenFlags open a file for a ReadOnly view.
const readOnlyOpenFlags = os.O_RDONLY
