package storenode

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/sgio"
)

// Fail-stop: a full disk (ENOSPC) or an IO error (EIO) in the WAL or in a checkpoint. The batch
// that hit it fails and is never acknowledged, and so does every batch in flight after it;
// from then on every commit, grant and read fails with ErrFailStop (no retry of a failed fsync:
// the kernel may have dropped the pages); a reopen, after kill -9 or after a power loss,
// recovers every acknowledged batch.

const failOwner = 4

// failStore is a store on a FaultFS with two tables and a model of the acknowledged batches.
type failStore struct {
	t      *testing.T
	fs     *vfs.FaultFS
	opts   Options
	e      *Engine
	m      *storeModel
	tables []*modelTable
	epochs map[uint32]uint64
	gen    batchGen

	commitMu sync.Mutex // assigns seqs and calls Commit, so seq order is commit order
	mu       sync.Mutex // guards the fields below; done callbacks take it
	seq      uint64
	batches  map[uint64]*base.Batch
	acked    uint64
}

func newFailStore(t *testing.T, opts Options) *failStore {
	fs := vfs.NewFaultFS()
	opts.Dir, opts.FS, opts.Logger = "db", fs, quietLogger
	if opts.CheckpointInterval == 0 {
		opts.CheckpointInterval = -1
	}
	s := &failStore{
		t: t, fs: fs, opts: opts, m: newStoreModel(), epochs: make(map[uint32]uint64),
		gen:     batchGen{rng: rand.New(rand.NewPCG(4, 4)), pages: 8, segsMax: 3},
		batches: make(map[uint64]*base.Batch),
	}
	var err error
	s.e, err = Open(opts)
	require.NoError(t, err)
	t.Cleanup(func() {
		if s.e != nil {
			s.e.Close()
		}
	})
	for _, spec := range []struct {
		name     string
		rowBytes int
	}{{"a", 64}, {"b", 200 + 8}} {
		info, err := s.e.CreateTable(spec.name, spec.rowBytes)
		require.NoError(t, err)
		s.tables = append(s.tables, s.m.addTable(info.ID, spec.rowBytes))
		g, err := s.e.Acquire(info.ID, failOwner, 0)
		require.NoError(t, err)
		s.epochs[info.ID] = g.Epoch
		requireGranted(t, s.e, info.ID, failOwner, g.Epoch)
	}
	return s
}

// commit sends n batches, up to inflight at a time, and returns the first error. Every done
// callback must be called exactly once; a batch counts as acknowledged only with a nil error.
func (s *failStore) commit(n, inflight int) error {
	results := make(chan error, n)
	sem := make(chan struct{}, inflight)
	var first error
	for range n {
		sem <- struct{}{}
		s.commitMu.Lock()
		s.mu.Lock()
		s.seq++
		seq := s.seq
		b := s.gen.next(failOwner, seq, s.tables, s.epochs)
		s.batches[seq] = b
		s.mu.Unlock()
		var calls int
		s.e.Commit(b, func(_ uint64, err error) {
			s.mu.Lock()
			calls++
			require.Equal(s.t, 1, calls, "done called twice for seq %d", seq)
			if err == nil {
				require.Equal(s.t, s.acked+1, seq, "acknowledged out of order")
				s.acked = seq
			}
			s.mu.Unlock()
			<-sem
			results <- err
		})
		s.commitMu.Unlock()
		select {
		case err := <-results:
			n--
			if err != nil && first == nil {
				first = err
			}
		default:
		}
		if first != nil {
			break
		}
	}
	for len(sem) > 0 || len(results) > 0 {
		if err := <-results; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// requireFailStop checks that every commit, grant and read is refused.
func (s *failStore) requireFailStop(cause error) {
	t := s.t
	mt := s.tables[0]
	epoch := s.epochs[mt.id]
	s.mu.Lock()
	seq := s.seq + 1
	s.mu.Unlock()
	_, err := s.e.CommitWait(&base.Batch{Owner: failOwner, Seq: seq, Fences: []base.Fence{{Table: mt.id, Epoch: epoch}}, Segments: []base.Segment{oneRow(mt.id, 1, row64(1))}})
	require.ErrorIs(t, err, ErrFailStop, "commit")
	if cause != nil {
		require.ErrorIs(t, err, cause, "the cause stays visible")
	}
	_, _, err = s.e.AllocIDs(mt.id, failOwner, epoch, 1)
	require.ErrorIs(t, err, ErrFailStop, "id grant")
	_, err = s.e.Acquire(mt.id, failOwner, 0)
	require.ErrorIs(t, err, ErrFailStop, "ownership grant")
	_, err = s.e.CreateTable("late", 64)
	require.ErrorIs(t, err, ErrFailStop, "create table")
	_, _, _, err = s.e.ReadRows(mt.id, 0, ^uint64(0), nil)
	require.ErrorIs(t, err, ErrFailStop, "read")
	_, _, err = s.e.PageDir(mt.id, 0, 100, 10, nil)
	require.ErrorIs(t, err, ErrFailStop, "page directory")
	require.ErrorIs(t, s.e.Checkpoint(), ErrFailStop, "checkpoint")
}

// failOnce makes the first IO of the store that match reports fail with EIO.
func (s *failStore) failOnce(match func(op vfs.Op) bool) {
	var once sync.Once
	s.fs.Inject(func(op vfs.Op) error {
		var err error
		if match(op) {
			once.Do(func() { err = syscall.EIO })
		}
		return err
	})
}

// powerLossRand is the rng reopen crashes with: seeded with seed1, seed2 for a power loss,
// nil (kill -9) without one.
func powerLossRand(power bool, seed1, seed2 uint64) *rand.Rand {
	if !power {
		return nil
	}
	return rand.New(rand.NewPCG(seed1, seed2))
}

// reopen ends the failed engine as a dead process would, crashes (power loss, or kill -9 if
// rng is nil), opens the store again and checks that every acknowledged batch is there and
// that the batches after it are whole or absent.
func (s *failStore) reopen(rng *rand.Rand) {
	t := s.t
	s.fs.SetCrashPoint(0)
	s.e.Close()
	s.fs.SetCapacity(0)
	if rng == nil {
		s.fs.CrashKeepAll()
	} else {
		s.fs.Crash(rng)
	}
	var err error
	s.e, err = Open(s.opts)
	require.NoError(t, err)
	var c uint64
	for _, mt := range s.tables {
		g, err := s.e.Acquire(mt.id, failOwner, 0)
		require.NoError(t, err)
		s.epochs[mt.id] = g.Epoch
		c = g.LastSeq
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	require.GreaterOrEqual(t, c, s.acked, "acknowledged batch lost")
	require.LessOrEqual(t, c, s.seq)
	for seq := uint64(1); seq <= c; seq++ {
		s.m.apply(s.batches[seq])
	}
	require.NoError(t, checkStore(s.e, s.m))
	s.seq, s.acked = c, c
	clear(s.batches)
}

func TestFailStopWALNoSpace(t *testing.T) {
	for _, sync := range []SyncMode{SyncAlways, SyncNone} {
		for _, power := range []bool{false, true} {
			t.Run(fmt.Sprintf("sync=%s/powerloss=%v", sync, power), func(t *testing.T) {
				s := newFailStore(t, Options{Sync: sync, WALSegmentBytes: 1 << 20, CheckpointWALBytes: -1})
				require.NoError(t, s.commit(20, 4))
				s.fs.SetCapacity(s.fs.Used() + 48<<10)
				err := s.commit(1000, 8)
				require.ErrorIs(t, err, syscall.ENOSPC)
				require.ErrorIs(t, err, ErrFailStop)
				require.Greater(t, s.acked, uint64(20), "commits went on until the disk was full")
				s.requireFailStop(syscall.ENOSPC)
				var rng *rand.Rand
				if power {
					if sync == SyncNone {
						t.Skip("SyncNone does not survive power loss")
					}
					rng = rand.New(rand.NewPCG(1, 1))
				}
				s.reopen(rng)
				require.NoError(t, s.commit(10, 4), "the reopened store takes commits")
			})
		}
	}
}

func TestFailStopWALSyncError(t *testing.T) {
	for i, power := range []bool{false, true} {
		t.Run(fmt.Sprintf("powerloss=%v", power), func(t *testing.T) {
			s := newFailStore(t, Options{Sync: SyncAlways})
			require.NoError(t, s.commit(10, 4))
			s.failOnce(func(op vfs.Op) bool { return op.Kind == vfs.OpSync && strings.HasPrefix(op.Name, "db/wal/") })
			err := s.commit(50, 8)
			require.ErrorIs(t, err, syscall.EIO)
			require.ErrorIs(t, err, ErrFailStop)
			s.requireFailStop(syscall.EIO)
			s.reopen(powerLossRand(power, uint64(i), 2))
			require.NoError(t, s.commit(10, 4))
		})
	}
}

func TestFailStopWALWriteError(t *testing.T) {
	s := newFailStore(t, Options{Sync: SyncNone})
	require.NoError(t, s.commit(10, 4))
	s.fs.SetFailAt(vfs.OpWrite, 3, nil)
	err := s.commit(50, 8)
	require.ErrorIs(t, err, syscall.EIO)
	s.requireFailStop(syscall.EIO)
	s.reopen(nil)
}

// TestFailStopCheckpoint fails each kind of IO a checkpoint makes, in turn: the checkpoint
// returns the error, the engine stops, and a reopen recovers from the old checkpoint and the
// WAL.
func TestFailStopCheckpoint(t *testing.T) {
	cases := []struct {
		name  string
		match func(op vfs.Op) bool
	}{
		{"data-write", func(op vfs.Op) bool { return op.Kind == vfs.OpWrite && strings.HasSuffix(op.Name, ".dat") }},
		{"data-sync", func(op vfs.Op) bool { return op.Kind == vfs.OpSync && strings.HasSuffix(op.Name, ".dat") }},
		{"dir-sync", func(op vfs.Op) bool { return op.Kind == vfs.OpSyncDir && op.Name == "db" }},
		{"wal-sync", func(op vfs.Op) bool { return op.Kind == vfs.OpSync && strings.HasPrefix(op.Name, "db/wal/") }},
		{"meta-create", func(op vfs.Op) bool { return op.Kind == vfs.OpCreate && strings.HasSuffix(op.Name, metaTempName) }},
		{"meta-write", func(op vfs.Op) bool { return op.Kind == vfs.OpWrite && strings.HasSuffix(op.Name, metaTempName) }},
		{"meta-sync", func(op vfs.Op) bool { return op.Kind == vfs.OpSync && strings.HasSuffix(op.Name, metaTempName) }},
		{"meta-rename", func(op vfs.Op) bool { return op.Kind == vfs.OpRename }},
		{"wal-remove", func(op vfs.Op) bool { return op.Kind == vfs.OpRemove && strings.HasPrefix(op.Name, "db/wal/") }},
	}
	for i, c := range cases {
		for _, power := range []bool{false, true} {
			t.Run(fmt.Sprintf("fail=%s/powerloss=%v", c.name, power), func(t *testing.T) {
				// With SyncNone the checkpoint's WAL sync is the first sync of the records;
				// a power loss needs SyncAlways, under which the checkpoint has no WAL to sync.
				mode := SyncNone
				if power {
					if c.name == "wal-sync" {
						t.Skip("with SyncAlways the WAL is synced before the checkpoint")
					}
					mode = SyncAlways
				}
				s := newFailStore(t, Options{Sync: mode, WALSegmentBytes: 8 << 10, CheckpointWALBytes: -1})
				require.NoError(t, s.commit(30, 4))
				require.NoError(t, s.e.Checkpoint()) // old segments to remove next time
				require.NoError(t, s.commit(30, 4))
				s.failOnce(c.match)
				err := s.e.Checkpoint()
				require.ErrorIs(t, err, syscall.EIO)
				require.ErrorIs(t, err, ErrFailStop)
				s.requireFailStop(syscall.EIO)
				s.reopen(powerLossRand(power, uint64(i), 3))
				require.NoError(t, s.commit(10, 4))
				require.NoError(t, s.e.Checkpoint())
			})
		}
	}
}

func TestFailStopCheckpointNoSpace(t *testing.T) {
	s := newFailStore(t, Options{Sync: SyncAlways, WALSegmentBytes: 4 << 20, CheckpointWALBytes: -1})
	require.NoError(t, s.commit(40, 4))
	// The WAL segment is preallocated; the data file has to grow.
	s.fs.SetCapacity(s.fs.Used() + 4096)
	err := s.e.Checkpoint()
	require.ErrorIs(t, err, syscall.ENOSPC)
	require.ErrorIs(t, err, ErrFailStop)
	s.requireFailStop(syscall.ENOSPC)
	s.reopen(rand.New(rand.NewPCG(5, 5)))
	require.NoError(t, s.e.Checkpoint())
}

// TestOpenFailureReleasesStore: an Open that fails after the WAL was opened (here: removing an
// orphan data file fails) must release everything it took, so that the process can open the
// store again once the fault is gone.
func TestOpenFailureReleasesStore(t *testing.T) {
	s := newFailStore(t, Options{})
	require.NoError(t, s.commit(5, 1))
	s.fs.SetCrashPoint(0)
	s.e.Close()
	s.fs.CrashKeepAll()
	orphan := dataFileName("db", 99)
	require.NoError(t, s.fs.WriteFile(orphan, make([]byte, 4096)))
	s.fs.Inject(func(op vfs.Op) error {
		if op.Kind == vfs.OpRemove && op.Name == orphan {
			return syscall.EIO
		}
		return nil
	})
	s.e = nil
	_, err := Open(s.opts)
	require.ErrorIs(t, err, syscall.EIO)
	s.fs.Inject(nil)
	s.e, err = Open(s.opts)
	require.NoError(t, err, "the failed Open left the store locked")
	require.NoError(t, checkStore(s.e, func() *storeModel {
		m := s.m.clone()
		for seq := uint64(1); seq <= s.acked; seq++ {
			m.apply(s.batches[seq])
		}
		return m
	}()))
	_, err = s.fs.ReadFile(orphan)
	require.Error(t, err, "the orphan is gone")
}

// TestFailStopNoSpaceCrossesTCP: after a full disk stopped the engine, every later commit,
// grant and read is refused with ErrFailStop wrapping the ENOSPC that caused it; over TCP the
// code it travels as must be FailStop (the node takes nothing until restarted), never NoSpace
// (which says "free space and retry", and loses errors.Is(err, ErrFailStop) on the client
// while an embedded engine's caller has it). The batch that hit the full disk is an unknown
// outcome (one code a reply: the outcome matters most) or a fail-stop, never NoSpace (CodeOf
// takes the ENOSPC fallback only when no sentinel matched).
func TestFailStopNoSpaceCrossesTCP(t *testing.T) {
	s := newFailStore(t, Options{Sync: SyncNone, WALSegmentBytes: 1 << 20, CheckpointWALBytes: -1})
	require.NoError(t, s.commit(20, 4))
	s.fs.SetCapacity(s.fs.Used() + 48<<10)
	first := s.commit(1000, 8)
	require.ErrorIs(t, first, syscall.ENOSPC)
	mt := s.tables[0]
	s.mu.Lock()
	seq := s.seq + 1
	s.mu.Unlock()
	_, commitErr := s.e.CommitWait(&base.Batch{Owner: failOwner, Seq: seq, Fences: []base.Fence{{Table: mt.id, Epoch: s.epochs[mt.id]}},
		Segments: []base.Segment{oneRow(mt.id, 1, row64(1))}})
	_, _, grantErr := s.e.AllocIDs(mt.id, failOwner, s.epochs[mt.id], 1)
	_, _, _, readErr := s.e.ReadRows(mt.id, 0, 1, nil)
	for _, err := range []error{first, commitErr, grantErr, readErr} {
		require.ErrorIs(t, err, ErrFailStop)
		require.ErrorIs(t, err, syscall.ENOSPC, "the cause stays visible in the engine's error")
		code := sgio.CodeOf(err)
		require.Contains(t, []sgio.Code{sgio.CodeFailStop, sgio.CodeUnknownOutcome}, code, "%v travels as %v", err, code)
		remote := sgio.ErrorFromWire(code, err.Error())
		if code == sgio.CodeUnknownOutcome {
			require.ErrorIs(t, remote, ErrUnknownOutcome, "one code a reply: the outcome comes first")
			continue
		}
		require.ErrorIs(t, remote, ErrFailStop, "errors.Is across TCP: %v", err)
	}
	require.Equal(t, sgio.CodeFailStop, sgio.CodeOf(commitErr))
}
