package vfs

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"syscall"

	"github.com/weftdb/weft/internal/procinfo"
)

// Default is the operating system's file system. What its durability calls are, per OS (the
// files os_linux.go, os_darwin.go, os_windows.go; every other OS fails to build):
//
//	            Sync                 SyncDir              Lock                  Allocate
//	linux       fdatasync            fsync of the dir     flock(LOCK_EX|NB)     fallocate(KEEP_SIZE)
//	darwin      fcntl(F_FULLFSYNC)   F_FULLFSYNC of dir   flock(LOCK_EX|NB)     none (advisory)
//	windows     FlushFileBuffers     none: Rename is      LockFileEx(EXCL|      none (advisory)
//	                                 MoveFileEx WRITE_    FAIL_IMMEDIATELY)
//	                                 THROUGH, Create and
//	                                 Remove flush the dir
//
// macOS's fsync does not flush the drive's cache: F_FULLFSYNC does, and is what survives a
// power loss there (Go's os.File.Sync uses it). Errors are *os.PathError or *os.LinkError
// holding the errno, so errors.Is(err, syscall.ENOSPC) and errors.Is(err, fs.ErrNotExist) work.
var Default FS = osFS{}

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

// heldLocks are the lock files Default.Lock holds in this process, by file identity (a path
// may be spelled many ways): flock and LockFileEx refuse a second lock of the same file from
// this process just as from another, and only this list tells the two apart. lockMu orders
// Lock and a lock's Close, so a lock closed just now is never taken for another process's.
var (
	lockMu    sync.Mutex
	heldLocks []*osLock
)

// osLock is a lock taken by Default.Lock; closing its descriptor (handle) releases it.
type osLock struct {
	f    *os.File
	info os.FileInfo
}

func (osFS) Lock(name string) (io.Closer, error) {
	return lockOSFile(name, os.O_RDWR|os.O_CREATE, 0o644)
}

// lockOSFile is Default.Lock, opening name with flag and perm (ReadOnly's Lock opens it
// O_RDONLY): every lock of this process, read-only or not, goes through heldLocks.
func lockOSFile(name string, flag int, perm os.FileMode) (io.Closer, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	if err := checkRegular(f, name); err != nil {
		_ = f.Close()
		return nil, err
	}
	info, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	lockMu.Lock()
	defer lockMu.Unlock()
	for _, l := range heldLocks {
		if os.SameFile(l.info, info) {
			_ = f.Close()
			return nil, fmt.Errorf("%w: %s", ErrLockedInProcess, name)
		}
	}
	rc, err := f.SyscallConn()
	if err == nil {
		err = control(rc, lockFile)
	}
	if err != nil {
		_ = f.Close()
		if isLocked(err) {
			holder, ok := procinfo.FlockHolder(info)
			return nil, fmt.Errorf("%w: %s%s: %w", ErrLocked, name, procinfo.HeldBy(holder, ok), err)
		}
		return nil, &os.PathError{Op: lockOp, Path: name, Err: err}
	}
	l := &osLock{f: f, info: info}
	heldLocks = append(heldLocks, l)
	return l, nil
}

// Close releases the lock: it closes the descriptor, then forgets the lock, both under lockMu.
// A second Close returns os.ErrClosed's error.
func (l *osLock) Close() error {
	lockMu.Lock()
	defer lockMu.Unlock()
	err := l.f.Close()
	if i := slices.Index(heldLocks, l); i >= 0 {
		heldLocks = slices.Delete(heldLocks, i, i+1)
	}
	return err
}

// control runs fn on the descriptor (a handle on Windows) behind rc, retrying EINTR, and
// returns fn's errno as it is for the caller to wrap, or os.ErrClosed when the file is already
// closed. It allocates nothing when fn captures nothing (a warm fdatasync per WAL group): the
// call's state lives in a pooled controlCall whose callback is bound once.
func control(rc syscall.RawConn, fn func(fd uintptr) error) error {
	c := controlCalls.Get().(*controlCall)
	c.fn, c.err, c.ran = fn, nil, false
	err := rc.Control(c.runFn)
	ran, errFn := c.ran, c.err
	c.fn, c.err = nil, nil
	controlCalls.Put(c)
	if err != nil || !ran {
		// Control refuses only a closed file, with an internal poll error; report what the
		// methods of os.File do.
		return os.ErrClosed
	}
	return errFn
}

// controlCall is one control in progress: fn and its outcome, and run bound as a method
// value once (per pooled object, not per call).
type controlCall struct {
	fn    func(fd uintptr) error
	err   error
	ran   bool
	runFn func(fd uintptr)
}

func (c *controlCall) run(fd uintptr) {
	c.ran = true
	for {
		c.err = c.fn(fd)
		if c.err != syscall.EINTR {
			return
		}
	}
}

var controlCalls = sync.Pool{New: func() any {
	c := &controlCall{}
	c.runFn = c.run
	return c
}}

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

// appendAtEnd appends a prefix of p at the end of the file with fstat + pwrite: correct only
// because Writes of one file do not race (File's contract). appendOnce uses it where the OS
// has no single call that appends at an offset-free position.
func (f *osFile) appendAtEnd(p []byte) (int, error) {
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

func (f *osFile) Size() (int64, error) {
	info, err := f.f.Stat()
	if err != nil {
		return 0, err
	}
	return info.Size(), nil
}

func (f *osFile) Truncate(size int64) error { return f.f.Truncate(size) }
