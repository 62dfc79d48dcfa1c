package vfs

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/weftdb/weft/internal/assert"
)

// FaultFS is an in-memory FS for crash tests: it keeps, for every file, the durable content and
// the writes not yet synced (per 512-byte sector), and for every directory the durable entries
// and the changes not yet synced, so that Crash can leave what a power loss may leave. It
// injects faults: a failed k-th operation of a kind (SetFailAt), any failure a test computes
// (Inject), a crash point after which every operation fails (SetCrashPoint), and a full disk
// (SetCapacity).
//
// Names are cleaned and taken from a single root, so "a/b", "/a/b" and "./a//b" are the same
// file. The root directory always exists. Differences from Default, all deliberate:
//   - directories cannot be renamed (Rename returns errors.ErrUnsupported);
//   - there are no sparse files: Truncate and Allocate count against the capacity, and fail
//     with syscall.ENOSPC beyond it;
//   - the space of a removed file is free at once, even while a File still has it open.
//
// The errors are *os.PathError (*os.LinkError for Rename) holding an errno as Default's do
// (syscall.ENOENT, syscall.ENOSPC, ...), ErrCrashed, os.ErrClosed, or the injected error.
//
// A FaultFS and its Files may be used from any goroutines; one mutex serialises every
// operation, except the Inject function, which runs outside it.
type FaultFS struct {
	mu            sync.Mutex
	root          *node
	gen           uint64         // bumped by every crash; a handle of an older one is dead
	locks         map[*node]bool // files locked by Lock in this generation
	capacityBytes int64          // 0: unlimited
	usedBytes     int64          // sum of the footprints of the files named in the tree
	faults        faults
}

var _ FS = (*FaultFS)(nil)

// NewFaultFS returns an empty FaultFS with unlimited capacity and no faults set.
func NewFaultFS() *FaultFS {
	return &FaultFS{root: newDir(), locks: map[*node]bool{}}
}

// faultFile is a File of a FaultFS. closed is guarded by fs.mu.
type faultFile struct {
	fs     *FaultFS
	n      *node
	name   string // as given to Create or Open, for errors
	clean  string // cleaned, for Op.Name
	gen    uint64
	closed bool
}

// faultLock is a lock taken by FaultFS.Lock.
type faultLock struct {
	fs     *FaultFS
	n      *node
	name   string
	gen    uint64
	closed bool
}

// cleanName maps any spelling of a name to its canonical form: slash-separated components
// below the root, "." for the root itself.
func cleanName(name string) string {
	p := path.Clean("/" + name)
	if p == "/" {
		return "."
	}
	return p[1:]
}

func pathError(kind OpKind, name string, err error) error {
	return &os.PathError{Op: kind.String(), Path: name, Err: err}
}

// lookup returns the node named by the clean name p.
func (fs *FaultFS) lookup(p string) (*node, error) {
	n := fs.root
	if p == "." {
		return n, nil
	}
	for c := range strings.SplitSeq(p, "/") {
		if !n.isDir {
			return nil, syscall.ENOTDIR
		}
		child, ok := n.children[c]
		if !ok {
			return nil, syscall.ENOENT
		}
		n = child
	}
	return n, nil
}

// lookupParent returns the directory holding the clean name p, and p's last component.
func (fs *FaultFS) lookupParent(p string) (*node, string, error) {
	if p == "." {
		return nil, "", syscall.EINVAL // the root is nobody's entry
	}
	d, err := fs.lookup(path.Dir(p))
	if err != nil {
		return nil, "", err
	}
	if !d.isDir {
		return nil, "", syscall.ENOTDIR
	}
	return d, path.Base(p), nil
}

// account runs change on file n and charges the change of its footprint to the disk.
func (fs *FaultFS) account(n *node, change func()) {
	before := n.footprint()
	change()
	if n.links > 0 {
		fs.usedBytes += n.footprint() - before
	}
	if fs.usedBytes < 0 {
		assert.Failf("vfs: used bytes %d < 0", fs.usedBytes)
	}
}

// unlink drops one directory entry naming file n, freeing its space with the last one.
func (fs *FaultFS) unlink(n *node) {
	n.links--
	if n.links < 0 {
		assert.Failf("vfs: file links %d < 0", n.links)
	}
	if n.links == 0 {
		fs.usedBytes -= n.footprint()
	}
}

// link adds a directory entry naming file n.
func (fs *FaultFS) link(n *node) {
	if n.links == 0 {
		fs.usedBytes += n.footprint()
	}
	n.links++
}

// roomFor returns how many bytes the footprint of n may grow by before the disk is full.
func (fs *FaultFS) roomFor() int64 {
	if fs.capacityBytes == 0 {
		return 1<<63 - 1
	}
	return max(0, fs.capacityBytes-fs.usedBytes)
}

// openFile returns the file named by p, creating it empty if create is set and it does not
// exist, truncating it if truncate is set.
func (fs *FaultFS) openFile(p string, create, truncate bool) (*node, error) {
	d, base, err := fs.lookupParent(p)
	if err != nil {
		return nil, err
	}
	n, ok := d.children[base]
	switch {
	case ok && n.isDir:
		return nil, syscall.EISDIR
	case ok:
		if truncate {
			fs.account(n, func() { n.truncate(0) })
		}
		return n, nil
	case !create:
		return nil, syscall.ENOENT
	}
	n = newFile()
	d.setEntry(dirOp{name: base, node: n})
	fs.link(n)
	return n, nil
}

// Create creates the named file for reading and writing, truncating it if it exists. Its entry
// is durable after SyncDir of its directory; truncating an existing file is a change of its
// content, durable after Sync.
func (fs *FaultFS) Create(name string) (File, error) {
	return fs.open(OpCreate, name, true)
}

// Open opens an existing file for reading and writing.
func (fs *FaultFS) Open(name string) (File, error) {
	return fs.open(OpOpen, name, false)
}

func (fs *FaultFS) open(kind OpKind, name string, create bool) (File, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	p := cleanName(name)
	if err := fs.admit(Op{Kind: kind, Name: p}, fs.gen); err != nil {
		return nil, pathError(kind, name, err)
	}
	n, err := fs.openFile(p, create, create)
	if err != nil {
		return nil, pathError(kind, name, err)
	}
	return &faultFile{fs: fs, n: n, name: name, clean: p, gen: fs.gen}, nil
}

// Remove removes the named file or empty directory. The removal is durable after SyncDir of
// its directory; until then a crash brings the entry back.
func (fs *FaultFS) Remove(name string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	p := cleanName(name)
	if err := fs.admit(Op{Kind: OpRemove, Name: p}, fs.gen); err != nil {
		return pathError(OpRemove, name, err)
	}
	d, base, err := fs.lookupParent(p)
	if err != nil {
		return pathError(OpRemove, name, err)
	}
	n, ok := d.children[base]
	if !ok {
		return pathError(OpRemove, name, syscall.ENOENT)
	}
	if n.isDir && len(n.children) > 0 {
		return pathError(OpRemove, name, syscall.ENOTEMPTY)
	}
	d.setEntry(dirOp{name: base})
	if !n.isDir {
		fs.unlink(n)
	}
	return nil
}

// Rename renames the file oldname to newname, replacing newname if it is a file. A rename within
// one directory is atomic and durable after SyncDir of the directory. A rename across
// directories is durable once both are synced; before that a crash may leave the file under
// both names or under neither. Directories cannot be renamed.
func (fs *FaultFS) Rename(oldname, newname string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	oldP, newP := cleanName(oldname), cleanName(newname)
	linkErr := func(err error) error {
		return &os.LinkError{Op: OpRename.String(), Old: oldname, New: newname, Err: err}
	}
	if err := fs.admit(Op{Kind: OpRename, Name: oldP, NewName: newP}, fs.gen); err != nil {
		return linkErr(err)
	}
	oldDir, oldBase, err := fs.lookupParent(oldP)
	if err != nil {
		return linkErr(err)
	}
	n, ok := oldDir.children[oldBase]
	if !ok {
		return linkErr(syscall.ENOENT)
	}
	if n.isDir {
		return linkErr(fmt.Errorf("vfs: FaultFS cannot rename a directory: %w", errors.ErrUnsupported))
	}
	newDir, newBase, err := fs.lookupParent(newP)
	if err != nil {
		return linkErr(err)
	}
	target, ok := newDir.children[newBase]
	switch {
	case ok && target == n:
		return nil // same file: nothing to do, as rename(2)
	case ok && target.isDir:
		return linkErr(syscall.EISDIR)
	case ok:
		fs.unlink(target)
	}
	if newDir == oldDir {
		oldDir.setEntry(dirOp{name: newBase, node: n, oldName: oldBase})
		return nil
	}
	oldDir.setEntry(dirOp{name: oldBase})
	newDir.setEntry(dirOp{name: newBase, node: n})
	return nil
}

// List returns the names of the entries of dir, sorted.
func (fs *FaultFS) List(dir string) ([]string, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	p := cleanName(dir)
	if err := fs.admit(Op{Kind: OpList, Name: p}, fs.gen); err != nil {
		return nil, pathError(OpList, dir, err)
	}
	d, err := fs.lookup(p)
	if err != nil {
		return nil, pathError(OpList, dir, err)
	}
	if !d.isDir {
		return nil, pathError(OpList, dir, syscall.ENOTDIR)
	}
	return slices.Sorted(maps.Keys(d.children)), nil
}

// MkdirAll creates dir and any missing parents, one OpMkdir in all. Each new directory's entry
// is durable after SyncDir of its parent; until then a crash loses it with all it holds.
func (fs *FaultFS) MkdirAll(dir string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	p := cleanName(dir)
	if err := fs.admit(Op{Kind: OpMkdir, Name: p}, fs.gen); err != nil {
		return pathError(OpMkdir, dir, err)
	}
	if p == "." {
		return nil
	}
	d := fs.root
	for c := range strings.SplitSeq(p, "/") {
		child, ok := d.children[c]
		if !ok {
			child = newDir()
			d.setEntry(dirOp{name: c, node: child})
		}
		if !child.isDir {
			return pathError(OpMkdir, dir, syscall.ENOTDIR)
		}
		d = child
	}
	return nil
}

// SyncDir makes the entry changes of dir (creations, renames, removals) durable.
func (fs *FaultFS) SyncDir(dir string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	p := cleanName(dir)
	if err := fs.admit(Op{Kind: OpSyncDir, Name: p}, fs.gen); err != nil {
		return pathError(OpSyncDir, dir, err)
	}
	d, err := fs.lookup(p)
	if err != nil {
		return pathError(OpSyncDir, dir, err)
	}
	if !d.isDir {
		return pathError(OpSyncDir, dir, syscall.ENOTDIR)
	}
	d.syncEntries()
	return nil
}

// Lock takes the lock of the named file, creating the file if needed. A second Lock of the
// same file fails with ErrLocked until the first is closed or a crash releases it.
func (fs *FaultFS) Lock(name string) (io.Closer, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	p := cleanName(name)
	if err := fs.admit(Op{Kind: OpLock, Name: p}, fs.gen); err != nil {
		return nil, pathError(OpLock, name, err)
	}
	n, err := fs.openFile(p, true, false)
	if err != nil {
		return nil, pathError(OpLock, name, err)
	}
	if fs.locks[n] {
		return nil, fmt.Errorf("%w: %s", ErrLocked, name)
	}
	fs.locks[n] = true
	return &faultLock{fs: fs, n: n, name: name, gen: fs.gen}, nil
}

// Close releases the lock. After a crash the lock is already gone and Close does nothing.
func (l *faultLock) Close() error {
	l.fs.mu.Lock()
	defer l.fs.mu.Unlock()
	if l.closed {
		return pathError(OpClose, l.name, os.ErrClosed)
	}
	l.closed = true
	if l.gen == l.fs.gen {
		delete(l.fs.locks, l.n)
	}
	return nil
}

// SetCapacity sets the size of the disk: a write, Truncate or Allocate that would make the
// files take more than capacityBytes fails with syscall.ENOSPC. A write first writes the whole
// sectors that still fit, as a real disk does, and returns their count with the error. Zero
// means unlimited (the initial state). Any goroutine may call it.
func (fs *FaultFS) SetCapacity(capacityBytes int64) {
	if capacityBytes < 0 {
		assert.Failf("vfs: capacity %d < 0", capacityBytes)
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.capacityBytes = capacityBytes
}

// Used returns the bytes the files take: for each file named in a directory, its size or the
// end of its Allocate reservation, whichever is larger.
func (fs *FaultFS) Used() int64 {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.usedBytes
}

// ReadFile returns a copy of the named file's current content (what ReadAt returns), bypassing
// fault injection and operation counting.
func (fs *FaultFS) ReadFile(name string) ([]byte, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	n, err := fs.lookup(cleanName(name))
	if err != nil {
		return nil, pathError(OpRead, name, err)
	}
	if n.isDir {
		return nil, pathError(OpRead, name, syscall.EISDIR)
	}
	return slices.Clone(n.data), nil
}

// WriteFile replaces the named file's content by data, durably (as if written and synced: a
// crash keeps it), bypassing fault injection, operation counting and the capacity. It creates
// the file, durably too, if it does not exist; its directory must. Tests use it to damage files
// as a bad disk would: flip bits, zero a sector, cut the tail. Open Files see the new content.
func (fs *FaultFS) WriteFile(name string, data []byte) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	p := cleanName(name)
	d, base, err := fs.lookupParent(p)
	if err != nil {
		return pathError(OpWrite, name, err)
	}
	n, ok := d.children[base]
	if ok && n.isDir {
		return pathError(OpWrite, name, syscall.EISDIR)
	}
	if !ok {
		n = newFile()
		d.setEntry(dirOp{name: base, node: n})
		d.synced[base] = n
		fs.link(n)
	}
	fs.account(n, func() {
		n.data = slices.Clone(data)
		n.durable = slices.Clone(data)
		n.dirty = nil
		n.lost = nil
	})
	return nil
}

// Crash simulates a power loss and the reboot after it. Every File of before fails with
// ErrCrashed, every lock is released (closing a lock of before does nothing), the faults are
// reset (see ResetFaults), and the FaultFS is the rebooted disk, for the code under test to
// recover from:
//   - each file holds its durable content plus a subset, chosen by rng, of the 512-byte
//     sectors written since its last Sync: any subset, not only a prefix, each sector whole or
//     not at all. Its size is the durable size, extended to the end of any kept sector beyond
//     it. Writes dropped by a failed Sync are lost.
//   - each directory holds its durable entries: every create, rename or remove (and MkdirAll)
//     not followed by SyncDir of its directory is undone: a created file disappears, a renamed
//     one is back under its old name, a removed one is back.
//
// A nil rng keeps no unsynced sector. The same rng state and the same history give the same
// outcome.
func (fs *FaultFS) Crash(rng *rand.Rand) { fs.crash(rng, false) }

// CrashPartialEntries is Crash, except that each directory also keeps a prefix, of a length
// chosen by rng, of its entry changes not yet made durable by SyncDir, as a journaling file
// system that committed some of them before the power went, so recovery also meets leftover
// temporary files and half-done sequences of creates, renames and removes.
func (fs *FaultFS) CrashPartialEntries(rng *rand.Rand) { fs.crash(rng, true) }

// CrashKeepAll simulates kill -9 of the process and its restart: the operating system
// survives, so every written byte and every entry change stays, still unsynced (a later
// Crash may lose it). Files of before fail with ErrCrashed, locks are released and the faults
// are reset.
func (fs *FaultFS) CrashKeepAll() {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.reboot()
}

// reboot kills the handles and locks of the previous generation and resets the faults.
func (fs *FaultFS) reboot() {
	fs.gen++
	clear(fs.locks)
	fs.faults.reset()
}

func (fs *FaultFS) crash(rng *rand.Rand, partialEntries bool) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.reboot()
	// Walk the surviving tree in name order, so that rng decides the same way for the same
	// history. A file named twice (a cross-directory rename synced on one side) crashes once.
	crashed := map[*node]bool{}
	var walk func(d *node)
	walk = func(d *node) {
		keepOps := 0
		if partialEntries && rng != nil {
			keepOps = rng.IntN(len(d.log) + 1)
		}
		d.crashEntries(keepOps)
		for _, name := range slices.Sorted(maps.Keys(d.children)) {
			n := d.children[name]
			if crashed[n] {
				continue
			}
			crashed[n] = true
			if n.isDir {
				walk(n)
			} else {
				n.crash(rng)
			}
		}
	}
	walk(fs.root)
	fs.recount()
}

// recount recomputes the links of every file and the used bytes from the tree.
func (fs *FaultFS) recount() {
	files := map[*node]bool{}
	var walk func(d *node)
	walk = func(d *node) {
		for _, n := range d.children {
			if n.isDir {
				walk(n)
				continue
			}
			if !files[n] {
				files[n] = true
				n.links = 0
			}
			n.links++
		}
	}
	walk(fs.root)
	fs.usedBytes = 0
	for n := range files {
		fs.usedBytes += n.footprint()
	}
}

// admit decides whether op, of a caller living in generation gen, runs; see faults.admit.
// fs.mu is held on entry and on return, but released while the Inject function runs, so a
// slow or blocking one stalls its own operation only. A crash meanwhile fails op.
func (fs *FaultFS) admit(op Op, gen uint64) error {
	if gen != fs.gen {
		return ErrCrashed
	}
	inject, err := fs.faults.admit(&op)
	if err != nil || inject == nil {
		return err
	}
	fs.mu.Unlock()
	err = inject(op)
	fs.mu.Lock()
	if gen != fs.gen {
		return ErrCrashed
	}
	return err
}

// begin checks that the file may run op and admits it; fs.mu is held (see FaultFS.admit).
func (f *faultFile) begin(op Op) error {
	if f.closed {
		return os.ErrClosed
	}
	op.Name = f.clean
	err := f.fs.admit(op, f.gen)
	if err == nil && f.closed {
		return os.ErrClosed // closed by another goroutine while the Inject function ran
	}
	return err
}

// ReadAt reads len(p) bytes at off; fewer, with io.EOF, at the end of the file.
func (f *faultFile) ReadAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.begin(Op{Kind: OpRead, Off: off, Len: int64(len(p))}); err != nil {
		return 0, pathError(OpRead, f.name, err)
	}
	if off < 0 {
		return 0, pathError(OpRead, f.name, syscall.EINVAL)
	}
	if len(p) == 0 {
		return 0, nil
	}
	if off >= int64(len(f.n.data)) {
		return 0, io.EOF
	}
	n := copy(p, f.n.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// WriteAt writes p at off, extending the file (zero-filling any gap) if needed.
func (f *faultFile) WriteAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.begin(Op{Kind: OpWrite, Off: off, Len: int64(len(p))}); err != nil {
		return 0, pathError(OpWrite, f.name, err)
	}
	if off < 0 {
		return 0, pathError(OpWrite, f.name, syscall.EINVAL)
	}
	return f.write(p, off)
}

// Write appends p at the end of the file.
func (f *faultFile) Write(p []byte) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.begin(Op{Kind: OpWrite, Off: int64(len(f.n.data)), Len: int64(len(p))}); err != nil {
		return 0, pathError(OpWrite, f.name, err)
	}
	// The end again: a WriteAt may have extended the file while the Inject function ran.
	return f.write(p, int64(len(f.n.data)))
}

// write writes p at off, or the prefix of whole sectors that fits the disk; fs.mu is held.
func (f *faultFile) write(p []byte, off int64) (int, error) {
	n := f.n
	end := off + int64(len(p))
	footprint := n.footprint()
	var errFull error
	if growth := end - footprint; growth > f.fs.roomFor() {
		errFull = syscall.ENOSPC
		fitEnd := footprint + f.fs.roomFor()
		// Bytes over the present footprint need new space; of those only whole sectors fit.
		end = max(min(footprint, end), fitEnd/sectorBytes*sectorBytes)
		end = max(end, off)
	}
	f.fs.account(n, func() { n.writeAt(p[:end-off], off) })
	if errFull != nil {
		return int(end - off), pathError(OpWrite, f.name, errFull)
	}
	return len(p), nil
}

// Sync makes the written bytes durable.
func (f *faultFile) Sync() error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.begin(Op{Kind: OpSync}); err != nil {
		if !errors.Is(err, ErrCrashed) && !errors.Is(err, os.ErrClosed) {
			f.n.syncFailed()
		}
		return pathError(OpSync, f.name, err)
	}
	f.n.sync()
	return nil
}

// Size returns the length of the file.
func (f *faultFile) Size() (int64, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.begin(Op{Kind: OpSize}); err != nil {
		return 0, pathError(OpSize, f.name, err)
	}
	return int64(len(f.n.data)), nil
}

// Truncate changes the length of the file, zero-filling a growth. The change is durable after
// Sync.
func (f *faultFile) Truncate(size int64) error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.begin(Op{Kind: OpTruncate, Off: size}); err != nil {
		return pathError(OpTruncate, f.name, err)
	}
	if size < 0 {
		return pathError(OpTruncate, f.name, syscall.EINVAL)
	}
	if size-f.n.footprint() > f.fs.roomFor() {
		return pathError(OpTruncate, f.name, syscall.ENOSPC)
	}
	f.fs.account(f.n, func() { f.n.truncate(size) })
	return nil
}

// Allocate reserves space for [off, off+n) against the capacity, without changing the size.
func (f *faultFile) Allocate(off, n int64) error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.begin(Op{Kind: OpAllocate, Off: off, Len: n}); err != nil {
		return pathError(OpAllocate, f.name, err)
	}
	if off < 0 || n < 0 {
		return pathError(OpAllocate, f.name, syscall.EINVAL)
	}
	if n == 0 {
		return nil
	}
	if off+n-f.n.footprint() > f.fs.roomFor() {
		return pathError(OpAllocate, f.name, syscall.ENOSPC)
	}
	f.fs.account(f.n, func() { f.n.allocEnd = max(f.n.allocEnd, off+n) })
	return nil
}

// Close closes the file. Closing a File of before a crash returns ErrCrashed (and closes it).
func (f *faultFile) Close() error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	err := f.begin(Op{Kind: OpClose})
	f.closed = true
	if err != nil {
		return pathError(OpClose, f.name, err)
	}
	return nil
}
