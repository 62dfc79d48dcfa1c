package vfs

import (
	"fmt"
	"syscall"

	"github.com/weftdb/weft/internal/assert"
)

// OpKind names an operation of FaultFS, for fault injection.
type OpKind uint8

// The operations of FaultFS. File methods: OpRead (ReadAt), OpWrite (WriteAt and Write),
// OpSync, OpTruncate, OpAllocate, OpSize, OpClose. FS methods: OpCreate, OpOpen, OpRemove,
// OpRename, OpList, OpMkdir (MkdirAll), OpSyncDir, OpLock.
const (
	OpRead OpKind = iota
	OpWrite
	OpSync
	OpTruncate
	OpAllocate
	OpSize
	OpClose
	OpCreate
	OpOpen
	OpRemove
	OpRename
	OpList
	OpMkdir
	OpSyncDir
	OpLock
	opKinds
)

var opKindNames = [opKinds]string{
	OpRead: "read", OpWrite: "write", OpSync: "sync", OpTruncate: "truncate",
	OpAllocate: "allocate", OpSize: "size", OpClose: "close", OpCreate: "create", OpOpen: "open",
	OpRemove: "remove", OpRename: "rename", OpList: "list", OpMkdir: "mkdir",
	OpSyncDir: "syncdir", OpLock: "lock",
}

// String returns the kind's name, as used in the Op field of the errors FaultFS returns.
func (k OpKind) String() string {
	if k < opKinds {
		return opKindNames[k]
	}
	return fmt.Sprintf("OpKind(%d)", uint8(k))
}

// Mutating reports whether operations of kind k can change what the disk holds or will hold
// after a crash: write, sync, truncate, allocate, create, remove, rename, mkdir and syncdir.
// FaultFS.Ops counts these, and a crash point is a number of them.
func (k OpKind) Mutating() bool {
	switch k {
	case OpWrite, OpSync, OpTruncate, OpAllocate, OpCreate, OpRemove, OpRename, OpMkdir, OpSyncDir:
		return true
	}
	return false
}

// opensFile reports whether operations of kind k open a file descriptor on a real file system:
// create, open, list, syncdir (the directory is opened to be synced) and lock.
func (k OpKind) opensFile() bool {
	switch k {
	case OpCreate, OpOpen, OpList, OpSyncDir, OpLock:
		return true
	}
	return false
}

// Op describes one operation, as handed to the function set with FaultFS.Inject.
type Op struct {
	Kind OpKind
	// Name is the file or directory operated on, cleaned (see FaultFS); for a File method, the
	// name the File was opened by.
	Name string
	// NewName is the target of OpRename; empty otherwise.
	NewName string
	// Off is the offset of OpRead, OpWrite (for Write: the end of file it appends at) and
	// OpAllocate, the new size of OpTruncate; zero otherwise.
	Off int64
	// Len is the length in bytes of OpRead, OpWrite and OpAllocate; zero otherwise.
	Len int64
	// Seq numbers a mutating operation: it is the value FaultFS.Ops returns once the operation
	// has been counted (1 for the first). Zero for the others.
	Seq int64
}

// String formats the operation for test failure messages.
func (op Op) String() string {
	s := fmt.Sprintf("%s %s", op.Kind, op.Name)
	switch op.Kind {
	case OpRename:
		s += " -> " + op.NewName
	case OpRead, OpWrite, OpAllocate:
		s += fmt.Sprintf(" [%d,+%d)", op.Off, op.Len)
	case OpTruncate:
		s += fmt.Sprintf(" to %d", op.Off)
	}
	if op.Seq > 0 {
		s += fmt.Sprintf(" #%d", op.Seq)
	}
	return s
}

// failRule fails the remaining-th next operation of kind with err.
type failRule struct {
	kind      OpKind
	remaining int
	err       error
}

// faults is the fault-injection state of a FaultFS, guarded by FaultFS.mu. The zero value
// injects nothing.
type faults struct {
	opsCount     int64 // mutating operations attempted, ever
	crashPointOn bool
	crashPoint   int64 // the Seq of the last mutating operation allowed to run
	stopped      bool  // the crash point has passed: every operation fails with ErrCrashed
	rules        []failRule
	inject       func(Op) error
	outOfFiles   bool // every operation that opens a descriptor fails with EMFILE
}

// SetFailAt makes the k-th operation of kind from now on (k = 1: the next one) fail with err,
// once; a nil err means syscall.EIO. A failed operation changes nothing, except a failed OpSync:
// the writes it should have made durable are dropped from the disk (reads still return them,
// also after CrashKeepAll, a process restart; later Syncs do not persist them unless they are
// written again; a Crash, a power loss, loses them), as Linux does after an fsync error
// ("fsyncgate").
// Rules set by several calls count independently. Any goroutine may call it.
func (fs *FaultFS) SetFailAt(kind OpKind, k int, err error) {
	if k < 1 {
		assert.Failf("vfs: SetFailAt k %d < 1", k)
	}
	if kind >= opKinds {
		assert.Failf("vfs: SetFailAt of unknown kind %d", kind)
	}
	if err == nil {
		err = syscall.EIO
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.faults.rules = append(fs.faults.rules, failRule{kind: kind, remaining: k, err: err})
}

// Inject sets fn to be called before every operation (after the crash point and SetFailAt
// rules, which it does not see when they fail the operation); a non-nil result fails the
// operation with that error, with the same effects as for SetFailAt. A nil fn removes it.
//
// fn runs without the FaultFS locked, possibly in several goroutines at once, so it may sleep
// or block to model a slow or stuck disk while other operations go on, and it may call the
// FaultFS: Crash, say, to lose power in the middle of a chosen operation, which then fails
// with ErrCrashed. Operations fn runs are injected too.
func (fs *FaultFS) Inject(fn func(op Op) error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.faults.inject = fn
}

// SetOutOfFiles, while on, fails every operation that would open a file descriptor on a real
// file system (OpCreate, OpOpen, OpList, OpSyncDir, OpLock) with syscall.EMFILE, as a process
// whose RLIMIT_NOFILE is used up meets it; operations on open Files go on. Crash points and
// SetFailAt rules are seen first; the Inject function is not called for a refused operation.
// Any goroutine may call it.
func (fs *FaultFS) SetOutOfFiles(on bool) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.faults.outOfFiles = on
}

// SetCrashPoint lets the next k mutating operations (see OpKind.Mutating) run, then fails every
// operation after the k-th, of any kind, with ErrCrashed, as if the process had died there, so
// the code under test stops; the test then calls Crash or CrashKeepAll. With k = 0 every
// operation fails from now on. A test that runs a workload once to count its operations with
// Ops can then run it again for each k to crash at every point. Any goroutine may call it.
func (fs *FaultFS) SetCrashPoint(k int64) {
	if k < 0 {
		assert.Failf("vfs: SetCrashPoint k %d < 0", k)
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.faults.crashPointOn = true
	fs.faults.crashPoint = fs.faults.opsCount + k
	fs.faults.stopped = k == 0
}

// CrashPointReached reports whether operations now fail because the crash point set with
// SetCrashPoint has passed. When it is still false after the workload, the workload ran to its
// end: a crash test iterating k has covered every crash point.
func (fs *FaultFS) CrashPointReached() bool {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.faults.stopped
}

// Ops returns the number of mutating operations (see OpKind.Mutating) attempted on fs since
// it was made, failed ones included. Crashes do not reset it.
func (fs *FaultFS) Ops() int64 {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.faults.opsCount
}

// ResetFaults removes the crash point, the SetFailAt rules, the Inject function and the
// out-of-files mode (SetOutOfFiles). Crash and
// CrashKeepAll do the same, so the rebooted disk is healthy. The capacity stays.
func (fs *FaultFS) ResetFaults() {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.faults.reset()
}

func (f *faults) reset() {
	*f = faults{opsCount: f.opsCount}
}

// admit counts op and decides whether it fails: with ErrCrashed past the crash point, else
// with the error of a SetFailAt rule. If not, it returns the Inject function to ask, if any.
func (f *faults) admit(op *Op) (func(Op) error, error) {
	if op.Kind.Mutating() {
		f.opsCount++
		op.Seq = f.opsCount
	}
	if f.stopped {
		return nil, ErrCrashed
	}
	if f.crashPointOn && op.Seq == f.crashPoint {
		f.stopped = true // this operation is the last one to run
	}
	var err error
	for i := 0; i < len(f.rules); i++ {
		r := &f.rules[i]
		if r.kind != op.Kind {
			continue
		}
		r.remaining--
		if r.remaining == 0 {
			if err == nil {
				err = r.err
			}
			f.rules = append(f.rules[:i], f.rules[i+1:]...)
			i--
		}
	}
	if err != nil {
		return nil, err
	}
	if f.outOfFiles && op.Kind.opensFile() {
		return nil, syscall.EMFILE
	}
	return f.inject, nil
}
