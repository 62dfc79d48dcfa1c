//go:build linux || darwin

package vfs

import (
	"errors"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

const lockOp = "flock"

// lockFile takes an exclusive flock without waiting. flock locks belong to the open file
// description: a second Lock of the same file fails even within one process.
func lockFile(fd uintptr) error { return unix.Flock(int(fd), unix.LOCK_EX|unix.LOCK_NB) }

// isLocked reports whether lockFile failed because another holder has the lock.
func isLocked(err error) bool { return errors.Is(err, syscall.EWOULDBLOCK) }

func (osFS) Rename(oldname, newname string) error { return os.Rename(oldname, newname) }

func (osFS) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	// os.File.Sync is fsync (F_FULLFSYNC on darwin), which a directory needs: fdatasync need
	// not flush its entries.
	errSync := d.Sync()
	errClose := d.Close()
	if errSync != nil {
		return errSync
	}
	return errClose
}

// readOnlyOpenFlags open a file for a ReadOnly view: O_NONBLOCK, so opening a FIFO does not
// wait for a writer (on a regular file it changes nothing).
const readOnlyOpenFlags = os.O_RDONLY | syscall.O_NONBLOCK
