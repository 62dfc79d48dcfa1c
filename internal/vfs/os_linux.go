package vfs

import (
	"os"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// appendFallback is set once pwritev2(RWF_APPEND) has been refused (kernels before 4.16); Write
// then appends with fstat + pwrite (appendAtEnd).
var appendFallback atomic.Bool

// appendOnce appends a prefix of p at the end of the file in one system call where the kernel
// allows it (pwritev2 with RWF_APPEND), so a concurrent WriteAt that extends the file cannot
// slip between finding the end and writing there.
func (f *osFile) appendOnce(p []byte) (int, error) {
	if !appendFallback.Load() {
		var n int
		err := control(f.rc, func(fd uintptr) error {
			var err error
			n, err = unix.Pwritev2(int(fd), [][]byte{p}, -1, unix.RWF_APPEND)
			return err
		})
		if err != syscall.EOPNOTSUPP && err != syscall.ENOSYS {
			return n, err
		}
		appendFallback.Store(true)
	}
	return f.appendAtEnd(p)
}

// Sync is fdatasync: the data and the size, not the other metadata.
func (f *osFile) Sync() error {
	if err := control(f.rc, func(fd uintptr) error { return unix.Fdatasync(int(fd)) }); err != nil {
		return &os.PathError{Op: "fdatasync", Path: f.name, Err: err}
	}
	return nil
}

// Allocate is fallocate(FALLOC_FL_KEEP_SIZE); a file system that cannot reserve space is
// allowed (Allocate is advisory).
func (f *osFile) Allocate(off, n int64) error {
	if n <= 0 {
		return nil
	}
	err := control(f.rc, func(fd uintptr) error {
		return unix.Fallocate(int(fd), unix.FALLOC_FL_KEEP_SIZE, off, n)
	})
	if err == syscall.EOPNOTSUPP || err == syscall.ENOSYS {
		return nil
	}
	if err != nil {
		return &os.PathError{Op: "fallocate", Path: f.name, Err: err}
	}
	return nil
}
