package storenode

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/logicpage"
)

// fsyncgate: the WAL's fdatasync fails (EIO) for a batch that was never acknowledged; Linux
// drops the dirty pages but keeps them readable until the machine goes down. The process
// restarts without a reboot, so recovery reads the record from the page cache. Its replay is
// larger than the disk page cache, so replay checkpoints. Then the power goes, during
// recovery (at every mutating operation in turn) or after it. The record must be whole or
// absent, never half applied. Fails on 767c454, whose replay checkpointed part of the record,
// with a checkpoint LSN before it, before the WAL's recovery had made the record durable.

const fsyncgateOwner = 3

// fsyncgateRows is the row of slot s of page p of the unacknowledged batch.
func fsyncgateRow(p, s int) []byte { return row64(uint64(p)<<32 | uint64(s) | 1<<62) }

// openRowOneStore opens a store in db on a fault FS, with a 1 MiB cache and no checkpoint
// trigger, and a table "t" of owner, who commits row 1 (seq 1).
func openRowOneStore(t *testing.T, owner uint64) (*vfs.FaultFS, Options, *Engine, base.TableInfo, base.Grant) {
	t.Helper()
	fs := vfs.NewFaultFS()
	opts := Options{Dir: "db", FS: fs, Logger: quietLogger, CacheBytes: 1 << 20,
		CheckpointInterval: -1, CheckpointWALBytes: -1}
	e := openEngine(t, opts)
	info, g := ownedTable(t, e, "t", 64, owner, testGrantPages)
	commitWait(t, e, batchOf(owner, 1, info.ID, g.Epoch, oneRow(info.ID, 1, row64(1))))
	return fs, opts, e, info, g
}

// fsyncgateSetup builds the store: one acknowledged batch checkpointed, then an 8-page batch
// whose fsync fails, then a process restart (page cache kept, dropped pages readable).
func fsyncgateSetup(t *testing.T) (*vfs.FaultFS, Options, uint32) {
	// A cache large enough for the workload, so no background checkpoint runs; recovery
	// runs with a small cache, so its replay must checkpoint.
	fs, opts, e, info, g := openRowOneStore(t, fsyncgateOwner)
	require.NoError(t, e.Checkpoint())
	// Acknowledged after the checkpoint: replay makes these pages dirty before the big batch.
	commitWait(t, e, batchOf(fsyncgateOwner, 2, info.ID, g.Epoch, oneRow(info.ID, 64, row64(64)),
		oneRow(info.ID, 128, row64(128)), oneRow(info.ID, 192, row64(192))))

	b := &base.Batch{Owner: fsyncgateOwner, Seq: 3, Fences: []base.Fence{{Table: info.ID, Epoch: g.Epoch}}}
	for p := range 8 {
		var rows []byte
		for s := range logicpage.RowsPerPage {
			rows = append(rows, fsyncgateRow(p, s)...)
		}
		b.Segments = append(b.Segments, base.Segment{Table: info.ID,
			Page: uint64(10 + p), Data: ^uint64(0), Rows: rows})
	}
	failWALSyncOnce(fs)
	_, err := e.CommitWait(b)
	require.ErrorIs(t, err, ErrUnknownOutcome)
	e.Close()
	fs.CrashKeepAll()
	opts.CacheBytes = 32 << 10 // about seven frames: the big batch does not fit after the others
	return fs, opts, info.ID
}

// failWALSyncOnce fails the next fsync of a WAL segment with EIO (a checkpoint's fsyncs,
// which cache pressure may start meanwhile, pass).
func failWALSyncOnce(fs *vfs.FaultFS) {
	var once sync.Once
	fs.Inject(func(op vfs.Op) error {
		var err error
		if op.Kind == vfs.OpSync && strings.Contains(op.Name, "wal/") {
			once.Do(func() { err = syscall.EIO })
		}
		return err
	})
}

// fsyncgateCheck opens the store after the power loss: the batch is whole or absent.
func fsyncgateCheck(t *testing.T, opts Options, table uint32, what string) {
	e, err := Open(opts)
	require.NoError(t, err, what)
	defer e.Close()
	for _, id := range []uint64{1, 64, 128, 192} {
		row, ok := readRow(t, e, table, id)
		require.True(t, ok, what)
		require.Equal(t, row64(id), row, what)
	}
	present := 0
	for p := range 8 {
		data, _, rows, err := e.ReadRows(table, uint64(10+p), ^uint64(0), nil)
		require.NoError(t, err, what)
		switch data {
		case 0:
		case ^uint64(0):
			present++
			for s := range logicpage.RowsPerPage {
				require.True(t, bytes.Equal(fsyncgateRow(p, s), rows[s*64:(s+1)*64]), "%s: page %d slot %d", what, p, s)
			}
		default:
			t.Fatalf("%s: page %d half written: %#x", what, p, data)
		}
	}
	require.True(t, present == 0 || present == 8, "%s: %d of the batch's 8 pages survived", what, present)
}

func TestFsyncgateRecovery(t *testing.T) {
	// Power loss right after recovery.
	fs, opts, table := fsyncgateSetup(t)
	e := openEngine(t, opts)
	require.NotZero(t, e.Stats().Checkpoints, "replay needed a checkpoint")
	fs.Crash(nil)
	e.Close()
	fsyncgateCheck(t, opts, table, "power loss after recovery")

	// Power loss at every mutating operation of recovery.
	fs, opts, _ = fsyncgateSetup(t)
	before := fs.Ops()
	e = openEngine(t, opts)
	recoveryOps := fs.Ops() - before
	e.Close()
	for k := int64(0); k < recoveryOps; k++ {
		fs, opts, table := fsyncgateSetup(t)
		fs.SetCrashPoint(k)
		if e, err := Open(opts); err == nil {
			e.Close()
		}
		fs.Crash(nil)
		fsyncgateCheck(t, opts, table, fmt.Sprintf("power loss after %d of recovery's %d operations", k, recoveryOps))
	}
}
