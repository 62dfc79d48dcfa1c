package vfs

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// Default is the operating system's file system (Linux): Sync is fdatasync, Allocate is
// fallocate(FALLOC_FL_KEEP_SIZE), SyncDir fsyncs the directory, Lock is flock(LOCK_EX|LOCK_NB).
// Errors are *os.PathError or *os.LinkError holding the errno, so errors.Is(err, syscall.ENOSPC)
// and errors.Is(err, fs.ErrNotExist) work.
var Default FS = osFS{}

// appendFallback is set once pwritev2(RWF_APPEND) has been refused (kernels before 4.16); Write
// then appends with fstat + pwrite, correct only because Writes of one file do not race.
var appendFallback atomic.Bool

type osFS struct{}

type osFile struct {
	f    *os.File
	rc   syscall.RawConn // f's descriptor, borrowed safely against a concurrent Close
	name string
}

func (osFS) Create(name string) (File, error) {
	return openOSFile(name, os.O_RDWR|os.O_CREATE|os.O_TRUNC)
}

func (osFS) Open(name string) (File, error) {
	return openOSFile(name, os.O_RDWR)
}

func openOSFile(name string, flag int) (File, error) {
	f, err := os.OpenFile(name, flag, 0o644)
	if err != nil {
		return nil, err
	}
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return nil, &os.PathError{Op: "open", Path: name, Err: err}
	}
	return &osFile{f: f, rc: rc, name: name}, nil
}

func (osFS) Remove(name string) error { return os.Remove(name) }

func (osFS) Rename(oldname, newname string) error { return os.Rename(oldname, newname) }

func (osFS) List(dir string) ([]string, error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	return names, nil
}

func (osFS) MkdirAll(dir string) error { return os.MkdirAll(dir, 0o755) }

func (osFS) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	// os.File.Sync is fsync, which a directory needs: fdatasync need not flush its entries.
	errSync := d.Sync()
	errClose := d.Close()
	if errSync != nil {
		return errSync
	}
	return errClose
}

func (osFS) Lock(name string) (io.Closer, error) {
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	rc, err := f.SyscallConn()
	if err == nil {
		err = control(rc, func(fd int) error { return unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) })
	}
	if err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s: %w", ErrLocked, name, err)
		}
		return nil, &os.PathError{Op: "flock", Path: name, Err: err}
	}
	// Closing the descriptor releases the flock.
	return f, nil
}

// control runs fn on the descriptor behind rc, retrying EINTR, and returns fn's errno as it is
// for the caller to wrap, or os.ErrClosed when the file is already closed.
func control(rc syscall.RawConn, fn func(fd int) error) error {
	var errFn error
	ran := false
	err := rc.Control(func(fd uintptr) {
		ran = true
		for {
			errFn = fn(int(fd))
			if errFn != syscall.EINTR {
				return
			}
		}
	})
	if err != nil || !ran {
		// Control refuses only a closed file, with an internal poll error; report what the
		// methods of os.File do.
		return os.ErrClosed
	}
	return errFn
}

func (f *osFile) ReadAt(p []byte, off int64) (int, error) { return f.f.ReadAt(p, off) }

func (f *osFile) WriteAt(p []byte, off int64) (int, error) { return f.f.WriteAt(p, off) }

func (f *osFile) Close() error { return f.f.Close() }

func (f *osFile) Write(p []byte) (int, error) {
	written := 0
	for written < len(p) {
		n, err := f.appendOnce(p[written:])
		written += n
		if err != nil {
			return written, &os.PathError{Op: "write", Path: f.name, Err: err}
		}
		if n == 0 {
			return written, &os.PathError{Op: "write", Path: f.name, Err: io.ErrShortWrite}
		}
	}
	return written, nil
}

// appendOnce appends a prefix of p at the end of the file in one system call where the kernel
// allows it (pwritev2 with RWF_APPEND), so a concurrent WriteAt that extends the file cannot
// slip between finding the end and writing there.
func (f *osFile) appendOnce(p []byte) (int, error) {
	if !appendFallback.Load() {
		var n int
		err := control(f.rc, func(fd int) error {
			var err error
			n, err = unix.Pwritev2(fd, [][]byte{p}, -1, unix.RWF_APPEND)
			return err
		})
		if err != syscall.EOPNOTSUPP && err != syscall.ENOSYS {
			return n, err
		}
		appendFallback.Store(true)
	}
	info, err := f.f.Stat()
	if err != nil {
		return 0, err
	}
	n, err := f.f.WriteAt(p, info.Size())
	var pathErr *os.PathError
	if errors.As(err, &pathErr) {
		err = pathErr.Err
	}
	return n, err
}

func (f *osFile) Sync() error {
	if err := control(f.rc, unix.Fdatasync); err != nil {
		return &os.PathError{Op: "fdatasync", Path: f.name, Err: err}
	}
	return nil
}

func (f *osFile) Size() (int64, error) {
	info, err := f.f.Stat()
	if err != nil {
		return 0, err
	}
	return info.Size(), nil
}

func (f *osFile) Truncate(size int64) error { return f.f.Truncate(size) }

func (f *osFile) Allocate(off, n int64) error {
	if n <= 0 {
		return nil
	}
	err := control(f.rc, func(fd int) error {
		return unix.Fallocate(fd, unix.FALLOC_FL_KEEP_SIZE, off, n)
	})
	if err == syscall.EOPNOTSUPP || err == syscall.ENOSYS {
		return nil // the file system cannot reserve space: allowed, Allocate is advisory
	}
	if err != nil {
		return &os.PathError{Op: "fallocate", Path: f.name, Err: err}
	}
	return nil
}
