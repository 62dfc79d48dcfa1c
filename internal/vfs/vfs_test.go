package vfs

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// fsUnderTest makes a fresh file system and a directory in it to work in.
type fsUnderTest struct {
	name string
	make func(t *testing.T) (FS, string)
}

var fileSystems = []fsUnderTest{
	{"fs=os", func(t *testing.T) (FS, string) { return Default, t.TempDir() }},
	{"fs=fault", func(t *testing.T) (FS, string) {
		f := NewFaultFS()
		require.NoError(t, f.MkdirAll("/data"))
		t.Cleanup(func() { requireConsistent(t, f) })
		return f, "/data"
	}},
}

// conformance is the behaviour every FS implementation shares.
var conformance = []struct {
	name string
	run  func(t *testing.T, fsys FS, dir string)
}{
	{"create-write-read", testCreateWriteRead},
	{"open-missing", testOpenMissing},
	{"create-truncates", testCreateTruncates},
	{"append", testAppend},
	{"truncate", testTruncate},
	{"rename-replace", testRenameReplace},
	{"remove", testRemove},
	{"list", testList},
	{"mkdir-all", testMkdirAll},
	{"lock", testLock},
	{"closed-file", testClosedFile},
	{"allocate", testAllocate},
	{"not-a-file", testNotAFile},
	{"concurrent-io", testConcurrentIO},
}

func TestConformance(t *testing.T) {
	for _, fsys := range fileSystems {
		t.Run(fsys.name, func(t *testing.T) {
			for _, c := range conformance {
				t.Run(c.name, func(t *testing.T) {
					f, dir := fsys.make(t)
					c.run(t, f, dir)
				})
			}
		})
	}
}

// readAll reads the whole file through f.
func readAll(t *testing.T, f File) []byte {
	t.Helper()
	size, err := f.Size()
	require.NoError(t, err)
	buf := make([]byte, size)
	n, err := f.ReadAt(buf, 0)
	if err == io.EOF && int64(n) == size {
		err = nil
	}
	require.NoError(t, err)
	require.Equal(t, int(size), n)
	return buf
}

// writeFile creates name with data, synced.
func writeFile(t *testing.T, fsys FS, name string, data []byte) {
	t.Helper()
	f, err := fsys.Create(name)
	require.NoError(t, err)
	_, err = f.WriteAt(data, 0)
	require.NoError(t, err)
	require.NoError(t, f.Sync())
	require.NoError(t, f.Close())
}

// contentOf opens name and returns its content.
func contentOf(t *testing.T, fsys FS, name string) []byte {
	t.Helper()
	f, err := fsys.Open(name)
	require.NoError(t, err)
	defer func() { require.NoError(t, f.Close()) }()
	return readAll(t, f)
}

func testCreateWriteRead(t *testing.T, fsys FS, dir string) {
	name := path.Join(dir, "f")
	f, err := fsys.Create(name)
	require.NoError(t, err)
	n, err := f.WriteAt([]byte("hello"), 0)
	require.NoError(t, err)
	require.Equal(t, 5, n)
	_, err = f.WriteAt([]byte("world"), 10) // leaves a gap of zeros
	require.NoError(t, err)
	size, err := f.Size()
	require.NoError(t, err)
	require.EqualValues(t, 15, size)
	require.Equal(t, []byte("hello\x00\x00\x00\x00\x00world"), readAll(t, f))

	buf := make([]byte, 8)
	n, err = f.ReadAt(buf, 10)
	require.ErrorIs(t, err, io.EOF, "a read across the end")
	require.Equal(t, 5, n)
	require.Equal(t, []byte("world"), buf[:n])
	n, err = f.ReadAt(buf, 15)
	require.ErrorIs(t, err, io.EOF, "a read at the end")
	require.Equal(t, 0, n)
	n, err = f.ReadAt(buf[:0], 100)
	require.NoError(t, err, "an empty read")
	require.Equal(t, 0, n)

	require.NoError(t, f.Sync())
	require.NoError(t, f.Close())
	require.Equal(t, []byte("hello\x00\x00\x00\x00\x00world"), contentOf(t, fsys, name))
}

func testOpenMissing(t *testing.T, fsys FS, dir string) {
	_, err := fsys.Open(path.Join(dir, "missing"))
	require.ErrorIs(t, err, fs.ErrNotExist)
	require.ErrorIs(t, err, syscall.ENOENT)
	var pathErr *fs.PathError
	require.ErrorAs(t, err, &pathErr)
	require.Equal(t, path.Join(dir, "missing"), pathErr.Path)
	_, err = fsys.Create(path.Join(dir, "no-dir", "f"))
	require.ErrorIs(t, err, fs.ErrNotExist, "a missing parent")
}

func testCreateTruncates(t *testing.T, fsys FS, dir string) {
	name := path.Join(dir, "f")
	writeFile(t, fsys, name, []byte("some bytes"))
	f, err := fsys.Create(name)
	require.NoError(t, err)
	size, err := f.Size()
	require.NoError(t, err)
	require.Zero(t, size)
	require.NoError(t, f.Close())
}

func testAppend(t *testing.T, fsys FS, dir string) {
	f, err := fsys.Create(path.Join(dir, "log"))
	require.NoError(t, err)
	defer func() { require.NoError(t, f.Close()) }()
	for _, s := range []string{"ab", "cd", ""} {
		n, err := f.Write([]byte(s))
		require.NoError(t, err)
		require.Equal(t, len(s), n)
	}
	_, err = f.WriteAt([]byte("XYZ"), 3) // extends the file: Write follows the new end
	require.NoError(t, err)
	_, err = f.Write([]byte("e"))
	require.NoError(t, err)
	require.Equal(t, []byte("abcXYZe"), readAll(t, f))
	require.NoError(t, f.Truncate(2))
	_, err = f.Write([]byte("!"))
	require.NoError(t, err)
	require.Equal(t, []byte("ab!"), readAll(t, f))
}

func testTruncate(t *testing.T, fsys FS, dir string) {
	f, err := fsys.Create(path.Join(dir, "f"))
	require.NoError(t, err)
	defer func() { require.NoError(t, f.Close()) }()
	_, err = f.WriteAt(bytes.Repeat([]byte{0xff}, 1000), 0)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(10))
	require.Equal(t, bytes.Repeat([]byte{0xff}, 10), readAll(t, f))
	require.NoError(t, f.Truncate(1000)) // the growth reads as zeros, not the old bytes
	want := append(bytes.Repeat([]byte{0xff}, 10), make([]byte, 990)...)
	require.Equal(t, want, readAll(t, f))
	require.NoError(t, f.Truncate(0))
	require.Empty(t, readAll(t, f))
}

func testRenameReplace(t *testing.T, fsys FS, dir string) {
	cur, tmp := path.Join(dir, "cur"), path.Join(dir, "cur.tmp")
	writeFile(t, fsys, cur, []byte("old"))
	writeFile(t, fsys, tmp, []byte("new"))
	require.NoError(t, fsys.Rename(tmp, cur))
	require.NoError(t, fsys.SyncDir(dir))
	require.Equal(t, []byte("new"), contentOf(t, fsys, cur))
	_, err := fsys.Open(tmp)
	require.ErrorIs(t, err, fs.ErrNotExist)
	names, err := fsys.List(dir)
	require.NoError(t, err)
	require.Equal(t, []string{"cur"}, names)

	err = fsys.Rename(tmp, cur)
	require.ErrorIs(t, err, fs.ErrNotExist)
	var linkErr *os.LinkError
	require.ErrorAs(t, err, &linkErr)

	require.NoError(t, fsys.Rename(cur, cur), "a rename onto itself")
	require.Equal(t, []byte("new"), contentOf(t, fsys, cur))

	// An open File follows its file through a rename.
	f, err := fsys.Open(cur)
	require.NoError(t, err)
	require.NoError(t, fsys.Rename(cur, path.Join(dir, "moved")))
	_, err = f.WriteAt([]byte("N"), 0)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	require.Equal(t, []byte("New"), contentOf(t, fsys, path.Join(dir, "moved")))
}

func testRemove(t *testing.T, fsys FS, dir string) {
	name := path.Join(dir, "f")
	writeFile(t, fsys, name, []byte("x"))
	require.NoError(t, fsys.Remove(name))
	_, err := fsys.Open(name)
	require.ErrorIs(t, err, fs.ErrNotExist)
	require.ErrorIs(t, fsys.Remove(name), fs.ErrNotExist)

	sub := path.Join(dir, "sub")
	require.NoError(t, fsys.MkdirAll(sub))
	writeFile(t, fsys, path.Join(sub, "g"), nil)
	require.ErrorIs(t, fsys.Remove(sub), syscall.ENOTEMPTY)
	require.NoError(t, fsys.Remove(path.Join(sub, "g")))
	require.NoError(t, fsys.Remove(sub))
	names, err := fsys.List(dir)
	require.NoError(t, err)
	require.Empty(t, names)
}

func testList(t *testing.T, fsys FS, dir string) {
	for _, n := range []string{"b", "a", "c"} {
		writeFile(t, fsys, path.Join(dir, n), nil)
	}
	require.NoError(t, fsys.MkdirAll(path.Join(dir, "d")))
	names, err := fsys.List(dir)
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b", "c", "d"}, names)
	_, err = fsys.List(path.Join(dir, "missing"))
	require.ErrorIs(t, err, fs.ErrNotExist)
	_, err = fsys.List(path.Join(dir, "a"))
	require.ErrorIs(t, err, syscall.ENOTDIR)
}

func testMkdirAll(t *testing.T, fsys FS, dir string) {
	deep := path.Join(dir, "x", "y", "z")
	require.NoError(t, fsys.MkdirAll(deep))
	require.NoError(t, fsys.MkdirAll(deep), "again")
	require.NoError(t, fsys.MkdirAll(dir), "an existing parent")
	writeFile(t, fsys, path.Join(deep, "f"), []byte("deep"))
	require.NoError(t, fsys.SyncDir(deep))
	require.NoError(t, fsys.SyncDir(path.Join(dir, "x")))
	require.Equal(t, []byte("deep"), contentOf(t, fsys, path.Join(deep, "f")))
	require.ErrorIs(t, fsys.MkdirAll(path.Join(deep, "f", "g")), syscall.ENOTDIR)
	require.ErrorIs(t, fsys.SyncDir(path.Join(dir, "missing")), fs.ErrNotExist)
}

func testLock(t *testing.T, fsys FS, dir string) {
	name := path.Join(dir, "LOCK")
	l1, err := fsys.Lock(name)
	require.NoError(t, err)
	_, err = fsys.Lock(name)
	require.ErrorIs(t, err, ErrLocked)
	require.Contains(t, err.Error(), "vfs: ")
	require.Contains(t, err.Error(), name)
	require.NoError(t, l1.Close())
	l2, err := fsys.Lock(name)
	require.NoError(t, err, "the lock is free again once closed")
	require.NoError(t, l2.Close())
	names, err := fsys.List(dir)
	require.NoError(t, err)
	require.Equal(t, []string{"LOCK"}, names, "Lock creates the file")
}

func testClosedFile(t *testing.T, fsys FS, dir string) {
	f, err := fsys.Create(path.Join(dir, "f"))
	require.NoError(t, err)
	require.NoError(t, f.Close())
	_, err = f.ReadAt(make([]byte, 1), 0)
	require.ErrorIs(t, err, os.ErrClosed)
	_, err = f.WriteAt([]byte("x"), 0)
	require.ErrorIs(t, err, os.ErrClosed)
	_, err = f.Write([]byte("x"))
	require.ErrorIs(t, err, os.ErrClosed)
	require.ErrorIs(t, f.Sync(), os.ErrClosed)
	_, err = f.Size()
	require.ErrorIs(t, err, os.ErrClosed)
	require.ErrorIs(t, f.Truncate(0), os.ErrClosed)
	require.ErrorIs(t, f.Allocate(0, 4096), os.ErrClosed)
	require.ErrorIs(t, f.Close(), os.ErrClosed)
}

func testAllocate(t *testing.T, fsys FS, dir string) {
	f, err := fsys.Create(path.Join(dir, "f"))
	require.NoError(t, err)
	defer func() { require.NoError(t, f.Close()) }()
	_, err = f.WriteAt([]byte("abc"), 0)
	require.NoError(t, err)
	require.NoError(t, f.Allocate(0, 1<<20))
	require.NoError(t, f.Allocate(4096, 0))
	size, err := f.Size()
	require.NoError(t, err)
	require.EqualValues(t, 3, size, "Allocate keeps the size")
	require.Equal(t, []byte("abc"), readAll(t, f))
}

func testNotAFile(t *testing.T, fsys FS, dir string) {
	_, err := fsys.Open(dir)
	require.ErrorIs(t, err, syscall.EISDIR)
	_, err = fsys.Create(dir)
	require.ErrorIs(t, err, syscall.EISDIR)
	writeFile(t, fsys, path.Join(dir, "f"), nil)
	_, err = fsys.Create(path.Join(dir, "f", "g"))
	require.ErrorIs(t, err, syscall.ENOTDIR)
}

// testConcurrentIO runs WriteAt, ReadAt, Sync and Size from several goroutines, as the storage
// engine does, for the race detector; each goroutine owns its own sectors.
func testConcurrentIO(t *testing.T, fsys FS, dir string) {
	f, err := fsys.Create(path.Join(dir, "f"))
	require.NoError(t, err)
	defer func() { require.NoError(t, f.Close()) }()
	const workers, rounds = 4, 50
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			sector := make([]byte, sectorBytes)
			got := make([]byte, sectorBytes)
			for r := range rounds {
				off := int64((r*workers + w) * sectorBytes)
				sector[0], sector[1] = byte(w), byte(r)
				if _, err := f.WriteAt(sector, off); err != nil {
					errs <- err
					return
				}
				if _, err := f.ReadAt(got, off); err != nil || !bytes.Equal(got, sector) {
					errs <- errors.Join(err, errors.New("read back differs"))
					return
				}
				if r%10 == 0 {
					if err := f.Sync(); err != nil {
						errs <- err
						return
					}
				}
				if _, err := f.Size(); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	size, err := f.Size()
	require.NoError(t, err)
	require.EqualValues(t, workers*rounds*sectorBytes, size)
}
