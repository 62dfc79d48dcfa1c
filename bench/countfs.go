package bench

import (
	"strings"
	"sync/atomic"

	"github.com/weftdb/weft/internal/vfs"
)

// countingFS wraps a vfs.FS and counts the bytes written to, and the syncs of, files whose
// path has the prefix walPrefix: the embedded storage engine's WAL, measured where it meets
// the file system, with no help from the engine.
type countingFS struct {
	vfs.FS
	walPrefix string
	walBytes  atomic.Uint64
	walSyncs  atomic.Uint64
}

func newCountingFS(fs vfs.FS, walDir string) *countingFS {
	return &countingFS{FS: fs, walPrefix: strings.TrimSuffix(walDir, "/") + "/"}
}

func (c *countingFS) wrap(name string, f vfs.File, err error) (vfs.File, error) {
	if err != nil || !strings.HasPrefix(name, c.walPrefix) {
		return f, err
	}
	return &countingFile{File: f, n: &c.walBytes, syncs: &c.walSyncs}, nil
}

func (c *countingFS) Create(name string) (vfs.File, error) {
	f, err := c.FS.Create(name)
	return c.wrap(name, f, err)
}

func (c *countingFS) Open(name string) (vfs.File, error) {
	f, err := c.FS.Open(name)
	return c.wrap(name, f, err)
}

type countingFile struct {
	vfs.File
	n, syncs *atomic.Uint64
}

func (f *countingFile) Sync() error {
	f.syncs.Add(1)
	return f.File.Sync()
}

func (f *countingFile) WriteAt(p []byte, off int64) (int, error) {
	n, err := f.File.WriteAt(p, off)
	f.n.Add(uint64(n))
	return n, err
}

func (f *countingFile) Write(p []byte) (int, error) {
	n, err := f.File.Write(p)
	f.n.Add(uint64(n))
	return n, err
}
