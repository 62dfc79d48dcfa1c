package vfs

import "os"

// appendOnce appends with fstat + pwrite: macOS has no pwritev2(RWF_APPEND).
func (f *osFile) appendOnce(p []byte) (int, error) { return f.appendAtEnd(p) }

// Sync is fcntl(F_FULLFSYNC), through os.File.Sync: macOS's fsync leaves the data in the
// drive's cache, F_FULLFSYNC flushes it, so only F_FULLFSYNC survives a power loss.
func (f *osFile) Sync() error {
	if err := f.f.Sync(); err != nil {
		return &os.PathError{Op: "fcntl(F_FULLFSYNC)", Path: f.name, Err: unwrapPath(err)}
	}
	return nil
}

// Allocate does nothing on macOS: it is advisory, and a file grows as it is written.
func (f *osFile) Allocate(off, n int64) error { return nil }
