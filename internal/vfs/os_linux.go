package vfs

import (
	"io"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

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

// longBits is the width of the kernel's long: pwritev takes the offset as two longs.
const longBits = int(unsafe.Sizeof(uintptr(0))) * 8

// iovecBatchMax is how many buffers one pwritev takes (the kernel's IOV_MAX is 1024).
const iovecBatchMax = 1024

// vecCall is one WriteVecAt in progress: its arguments and its iovec array, reused (pooled),
// so a call allocates nothing.
type vecCall struct {
	bufs [][]byte
	off  int64
	n    int
	iov  []unix.Iovec
}

var vecCalls = sync.Pool{New: func() any { return &vecCall{} }}

// WriteVecAt writes the concatenation of bufs at off with pwritev, IOV_MAX buffers per call,
// resuming after a short write and EINTR. Any goroutine may call it, but not concurrently
// with Close (it uses the descriptor directly: RawConn.Control would allocate a closure per
// call); it does not retain bufs.
func (f *osFile) WriteVecAt(bufs [][]byte, off int64) (int, error) {
	c := vecCalls.Get().(*vecCall)
	c.bufs, c.off, c.n = bufs, off, 0
	var err error
	for {
		if err = c.run(f.f.Fd()); err != syscall.EINTR {
			break
		}
	}
	runtime.KeepAlive(f.f)
	n := c.n
	clear(c.iov[:cap(c.iov)])
	c.bufs = nil
	vecCalls.Put(c)
	if err != nil {
		return n, &os.PathError{Op: "pwritev", Path: f.name, Err: err}
	}
	return n, nil
}

// run writes c.bufs from c.n on; after EINTR WriteVecAt calls it again, and it resumes where
// the bytes written so far end.
func (c *vecCall) run(fd uintptr) error {
	skip := c.n // bytes of bufs already written
	i := 0
	for i < len(c.bufs) && skip >= len(c.bufs[i]) {
		skip -= len(c.bufs[i])
		i++
	}
	for i < len(c.bufs) {
		c.iov = c.iov[:0]
		for j := i; j < len(c.bufs) && len(c.iov) < iovecBatchMax; j++ {
			b := c.bufs[j]
			if j == i {
				b = b[skip:]
			}
			if len(b) == 0 {
				continue
			}
			v := unix.Iovec{Base: &b[0]}
			v.SetLen(len(b))
			c.iov = append(c.iov, v)
		}
		if len(c.iov) == 0 {
			return nil
		}
		off := c.off + int64(c.n)
		r, _, e := unix.Syscall6(unix.SYS_PWRITEV, fd, uintptr(unsafe.Pointer(&c.iov[0])), uintptr(len(c.iov)),
			uintptr(off), uintptr(uint64(off)>>(longBits-1)>>1), 0) // pos_l, pos_h
		if e != 0 {
			return e
		}
		if r == 0 {
			return io.ErrShortWrite
		}
		c.n += int(r)
		skip += int(r)
		for i < len(c.bufs) && skip >= len(c.bufs[i]) {
			skip -= len(c.bufs[i])
			i++
		}
	}
	return nil
}
