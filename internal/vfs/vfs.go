// Package vfs is the small file-system interface through which every Weft file IO goes, so
// tests can inject faults: torn writes, lost unsynced data, lost directory entries, failed
// writes and syncs, a full disk.
//
// Two implementations: Default (the operating system: Linux, macOS and Windows, each with its
// own durability calls, see Default) and FaultFS, the in-memory fault-injecting FS for crash
// tests.
//
// Durability model, which both implementations follow and which the storage engine relies on:
//   - Bytes written to a File are durable only after File.Sync returns nil. So is a change of
//     its size (Truncate, or a write past the end).
//   - A created, renamed or removed directory entry is durable only after SyncDir on its
//     directory returns nil (as on Linux ext4/xfs without dirsync). MkdirAll's new directories
//     are entries of their parents like any other.
//   - Rename replaces the target atomically: after a crash a name refers to the old file or
//     the new one, never to a mixture.
//   - After a failed Sync the unsynced bytes may never reach the disk, even if a later Sync
//     succeeds (Linux marks the pages clean after an fsync error): a failed Sync is final for
//     the data it covered, and the storage engine stops (fail-stop).
//
// FaultFS models a power loss (FaultFS.Crash) as the worst this model allows:
//
//	file content  durable bytes, plus any subset (not only a prefix) of the 512-byte sectors
//	              written since the last Sync, each sector atomic: all old or all new bytes
//	file size     the durable size, extended to the end of a kept sector lying beyond it
//	entries       the durable ones: an unsynced create, rename, remove or mkdir is undone
//	              (FaultFS.CrashPartialEntries keeps a random prefix of them instead)
//	failed Sync   the writes it covered are lost, whatever later Syncs return
//
// and a kill -9 of the process (FaultFS.CrashKeepAll) as nothing lost, nothing made durable.
// Either way, Files opened before fail with ErrCrashed and locks are released.
//
// Names are slash-separated paths; implementations accept relative or absolute ones.
package vfs

import "io"

// FS is a file system. Its methods may be called from any goroutine.
type FS interface {
	// Create creates the named file for reading and writing, truncating it if it exists.
	Create(name string) (File, error)
	// Open opens an existing file for reading and writing.
	Open(name string) (File, error)
	// Remove removes the named file or empty directory.
	Remove(name string) error
	// Rename renames oldname to newname, replacing newname if it exists.
	Rename(oldname, newname string) error
	// List returns the names (not paths) of the entries of dir, sorted.
	List(dir string) ([]string, error)
	// MkdirAll creates dir and any missing parents.
	MkdirAll(dir string) error
	// SyncDir makes the directory's entries (creations, renames, removals) durable.
	SyncDir(dir string) error
	// Lock takes an exclusive advisory lock on the named file (creating it), held until the
	// returned Closer is closed, so a second process cannot open the same store.
	Lock(name string) (io.Closer, error)
}

// File is an open file. ReadAt, WriteAt and Sync may be called concurrently from several
// goroutines, as with *os.File; Write (append) must not race with another Write.
type File interface {
	io.ReaderAt
	io.WriterAt
	io.Closer
	// Write appends p at the end of the file.
	Write(p []byte) (int, error)
	// Sync makes all written bytes durable (fdatasync).
	Sync() error
	// Size returns the current length of the file in bytes.
	Size() (int64, error)
	// Truncate changes the length of the file.
	Truncate(size int64) error
	// Allocate reserves disk space for [off, off+n) without changing what reads return beyond
	// the current size (fallocate with FALLOC_FL_KEEP_SIZE). It may be a no-op.
	Allocate(off, n int64) error
}
