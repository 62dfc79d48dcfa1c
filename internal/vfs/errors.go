package vfs

import "errors"

// Errors of taking a lock.
var (
	// ErrLocked is wrapped by the error Lock returns when another holder (another process for
	// Default, another Lock call on the same FaultFS) already holds the lock.
	ErrLocked = errors.New("vfs: locked by another holder")
	// ErrLockedInProcess is wrapped by the error Default.Lock returns when this process
	// already holds the lock (an earlier Lock of the same file, by any path, not yet closed).
	// It matches ErrLocked too, but reads as what it is.
	ErrLockedInProcess error = &inProcessError{}
)

// Errors of FaultFS only: the real operating system never returns them.
var (
	// ErrCrashed is wrapped by every operation on a File opened before FaultFS.Crash or
	// FaultFS.CrashKeepAll, and by every operation after a crash point set with
	// FaultFS.SetCrashPoint has been passed: the simulated process is dead.
	ErrCrashed = errors.New("vfs: crashed")
)

// inProcessError is ErrLockedInProcess: its own message, and ErrLocked under errors.Is.
type inProcessError struct{}

// Error reports the message.
func (*inProcessError) Error() string { return "vfs: already locked by this process" }

// Unwrap reports ErrLocked.
func (*inProcessError) Unwrap() error { return ErrLocked }

// Errors of a ReadOnly view.
var (
	// ErrReadOnly is returned by every call of a ReadOnly view that would change something.
	ErrReadOnly = errors.New("vfs: read-only view")
	// ErrNotRegular is wrapped by the error a ReadOnly view of Default returns for Open and
	// Lock of something that is not a regular file (a FIFO, a device, a directory): opening
	// a FIFO for reading would block until a writer came.
	ErrNotRegular = errors.New("vfs: not a regular file")
)
