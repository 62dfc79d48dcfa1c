package vfs

import (
	"fmt"
	"io"
	"os"
)

// ReadOnly returns a view of fs that can only read, for tools that must leave a store's
// directory exactly as they found it (storenode.Check). Open opens a file for reading only
// (O_RDONLY on Default, so a read-only copy can be checked too, with O_NONBLOCK on Unix); Lock
// takes the same exclusive lock as fs.Lock but only on a file that exists (it never creates
// one, and fails with an error wrapping fs.ErrNotExist otherwise). On Default both refuse
// anything but a regular file with an error wrapping ErrNotRegular, so a FIFO never blocks
// them. List reads as fs does. Every call that would change something (Create, Remove,
// Rename, MkdirAll, SyncDir, and a File's WriteAt, Write, Sync, Truncate and Allocate) fails
// with ErrReadOnly and does not reach fs. Its methods may be called from any goroutine.
func ReadOnly(fs FS) FS { return readOnlyFS{fs: fs} }

type readOnlyFS struct{ fs FS }

type readOnlyFile struct{ f File }

func (r readOnlyFS) Open(name string) (File, error) {
	if _, ok := r.fs.(osFS); ok {
		f, err := openOSFile(name, readOnlyOpenFlags)
		if err != nil {
			return nil, err
		}
		if err := checkRegular(f.(*osFile).f, name); err != nil {
			_ = f.Close()
			return nil, err
		}
		return readOnlyFile{f: f}, nil
	}
	f, err := r.fs.Open(name)
	if err != nil {
		return nil, err
	}
	return readOnlyFile{f: f}, nil
}

func (r readOnlyFS) Lock(name string) (io.Closer, error) {
	if _, ok := r.fs.(osFS); ok {
		// Opened read-only and without blocking (never created; a FIFO must not hang the
		// check), refused unless a regular file, and held in the process's registry like
		// Default's own locks, so each tells the other from another process's.
		return lockOSFile(name, readOnlyOpenFlags, 0)
	}
	// Another FS (FaultFS): make sure the file exists, so Lock does not create it.
	f, err := r.fs.Open(name)
	if err != nil {
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	return r.fs.Lock(name)
}

// checkRegular refuses an open file that is not a regular file (ErrNotRegular).
func checkRegular(f *os.File, name string) error {
	info, err := f.Stat()
	if err != nil {
		return err
	}
	if !info.Mode().IsRegular() {
		return &os.PathError{Op: "open", Path: name, Err: fmt.Errorf("%w (%v)", ErrNotRegular, info.Mode().Type())}
	}
	return nil
}

func (r readOnlyFS) List(dir string) ([]string, error) { return r.fs.List(dir) }

func (readOnlyFS) Create(name string) (File, error) { return nil, readOnlyError("create", name) }
func (readOnlyFS) Remove(name string) error         { return readOnlyError("remove", name) }
func (readOnlyFS) MkdirAll(dir string) error        { return readOnlyError("mkdir", dir) }
func (readOnlyFS) SyncDir(dir string) error         { return readOnlyError("syncdir", dir) }
func (readOnlyFS) Rename(oldname, newname string) error {
	return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: ErrReadOnly}
}

func readOnlyError(op, name string) error { return &os.PathError{Op: op, Path: name, Err: ErrReadOnly} }

func (r readOnlyFile) ReadAt(p []byte, off int64) (int, error) { return r.f.ReadAt(p, off) }
func (r readOnlyFile) Size() (int64, error)                    { return r.f.Size() }
func (r readOnlyFile) Close() error                            { return r.f.Close() }
func (readOnlyFile) WriteAt([]byte, int64) (int, error)        { return 0, ErrReadOnly }
func (readOnlyFile) Write([]byte) (int, error)                 { return 0, ErrReadOnly }
func (readOnlyFile) Sync() error                               { return ErrReadOnly }
func (readOnlyFile) Truncate(int64) error                      { return ErrReadOnly }
func (readOnlyFile) Allocate(int64, int64) error               { return ErrReadOnly }
