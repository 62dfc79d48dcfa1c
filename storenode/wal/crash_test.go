package wal

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/testseed"
	"github.com/weftdb/weft/internal/vfs"
)

// crashModel is what a test knows about a log across failures, crashes and reopens.
type crashModel struct {
	t    testing.TB
	mode SyncMode

	mu         sync.Mutex
	log        map[uint64][]byte // records recovered by an Open (durable from then on)
	attempted  map[uint64][]byte // records appended since the last Open, acknowledged or not
	mustLSN    uint64            // every record up to it must survive the next crash
	ackedLSN   uint64            // the highest acknowledged LSN since the last Open
	lastDone   uint64            // the LSN of the last done callback, for their order
	failedLSN  uint64            // the first LSN that failed since the last Open, 0 if none
	checkpoint uint64            // the published checkpoint LSN: Open's After
	badMsgs    []string          // violations seen on the writer goroutine
	trace      []string          // what happened, printed when a check fails
}

func (m *crashModel) tracef(format string, args ...any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.trace = append(m.trace, fmt.Sprintf(format, args...))
}

func newCrashModel(t testing.TB, mode SyncMode) *crashModel {
	return &crashModel{t: t, mode: mode, log: map[uint64][]byte{}, attempted: map[uint64][]byte{}}
}

// open opens the log, checks the recovered records against the model, and makes them the
// model's log.
func (m *crashModel) open(fs vfs.FS, opts Options, msg string) *WAL {
	m.t.Helper()
	opts.After = m.checkpoint
	w, got, err := openCollect(m.t, fs, opts)
	require.NoError(m.t, err, msg)
	m.mu.Lock()
	defer m.mu.Unlock()
	require.Empty(m.t, m.badMsgs, msg)
	next := m.checkpoint + 1
	for _, r := range got {
		require.Equal(m.t, next, r.LSN, "%s: replay is a prefix without holes", msg)
		next++
		want, ok := m.log[r.LSN]
		if !ok {
			want, ok = m.attempted[r.LSN]
		}
		require.True(m.t, ok, "%s: LSN %d was never appended", msg, r.LSN)
		require.Equal(m.t, want, r.Payload, "%s: LSN %d is whole", msg, r.LSN)
	}
	last := next - 1
	m.trace = append(m.trace, fmt.Sprintf("%s: opened, replayed %d..%d, must %d, acked %d, failed %d", msg, m.checkpoint+1, last, m.mustLSN, m.ackedLSN, m.failedLSN))
	require.GreaterOrEqual(m.t, last, m.mustLSN, "%s: every acknowledged (durable) record survives\n%s", msg, strings.Join(m.trace, "\n"))
	for lsn := range m.log {
		require.True(m.t, lsn <= last || lsn <= m.checkpoint, "%s: recovered LSN %d lost", msg, lsn)
	}
	require.Equal(m.t, last, w.LastLSN(), msg)
	require.Equal(m.t, last, w.SyncedThrough(), msg)
	for lsn := range m.log {
		if lsn > last {
			delete(m.log, lsn)
		}
	}
	for _, r := range got {
		m.log[r.LSN] = r.Payload
	}
	clear(m.attempted)
	m.mustLSN = last // Open synced what it recovered
	m.ackedLSN, m.lastDone, m.failedLSN = last, last, 0
	return w
}

// done is the AppendAsync callback's model update; it runs on the writer goroutine.
func (m *crashModel) done(w *WAL, lsn uint64, payload []byte, force bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.attempted[lsn] = payload
	if lsn <= m.lastDone {
		m.badMsgs = append(m.badMsgs, fmt.Sprintf("callback of LSN %d after %d", lsn, m.lastDone))
	}
	m.lastDone = lsn
	if err != nil {
		if !errors.Is(err, ErrFailStop) {
			m.badMsgs = append(m.badMsgs, fmt.Sprintf("LSN %d failed without ErrFailStop: %v", lsn, err))
		}
		if m.failedLSN == 0 {
			m.failedLSN = lsn
		}
		return
	}
	if m.failedLSN != 0 {
		m.badMsgs = append(m.badMsgs, fmt.Sprintf("LSN %d acknowledged after LSN %d failed", lsn, m.failedLSN))
	}
	m.ackedLSN = max(m.ackedLSN, lsn)
	if m.mode == SyncAlways || force {
		m.mustLSN = max(m.mustLSN, lsn)
	}
	m.mustLSN = max(m.mustLSN, w.SyncedThrough())
}

// appendBursts appends records in bursts of AppendAsync calls from two goroutines until
// each has appended n or an append fails. Now and then it syncs and checkpoints (publishes
// the synced LSN as the next Open's After and drops the segments below it).
func (m *crashModel) appendBursts(w *WAL, rng *rand.Rand, n int) {
	var wg sync.WaitGroup
	for g := range 2 {
		grng := rand.New(rand.NewPCG(rng.Uint64(), uint64(g)))
		wg.Go(func() {
			for i := 0; i < n; {
				burst := 1 + grng.IntN(6)
				results := make(chan error, burst)
				queued := 0
				for range burst {
					p := make([]byte, grng.IntN(300))
					for k := range p {
						p[k] = byte(grng.Uint32())
					}
					force := grng.IntN(8) == 0
					done := func(lsn uint64, err error) {
						m.done(w, lsn, p, force, err)
						results <- err
					}
					var err error
					if grng.IntN(2) == 0 {
						err = w.AppendAsync(byte(g), [][]byte{p}, force, done)
					} else {
						// Pieces, some kept (written from p by the group's gather write),
						// so a crash or a fault may land between a record's pieces.
						err = w.AppendPiecesAsync(byte(g), randomPieces(grng, p), force, done)
					}
					if err != nil {
						require.ErrorIs(m.t, err, ErrFailStop)
						break
					}
					queued++
				}
				failed := queued < burst
				for range queued {
					failed = <-results != nil || failed
				}
				if failed {
					return
				}
				i += burst
				if grng.IntN(10) == 0 && g == 0 {
					if w.Sync() != nil {
						return
					}
					c := w.SyncedThrough()
					m.tracef("checkpoint %d", c)
					m.mu.Lock()
					m.mustLSN = max(m.mustLSN, c)
					m.checkpoint = max(m.checkpoint, c)
					m.mu.Unlock()
					_ = w.DropBefore(c + 1)
				}
			}
		})
	}
	wg.Wait()
}

// randomPieces cuts p into up to four pieces at random points, each kept or copied at random.
func randomPieces(rng *rand.Rand, p []byte) []Piece {
	var ps []Piece
	for len(p) > 0 && len(ps) < 3 {
		n := rng.IntN(len(p) + 1)
		ps = append(ps, Piece{Bytes: p[:n], Keep: rng.IntN(2) == 0})
		p = p[n:]
	}
	return append(ps, Piece{Bytes: p, Keep: rng.IntN(2) == 0})
}

// TestCrashPowerLoss crashes a FaultFS at random points of a workload, several times per
// seed: every acknowledged record survives, replay is a prefix of what was appended, and
// unacknowledged records are whole or absent.
func TestCrashPowerLoss(t *testing.T) {
	seeds := 300
	if testing.Short() {
		seeds = 40
	}
	for seed := range uint64(seeds) {
		if only, ok := testseed.Replay(t); ok && seed != only { // WEFT_SEED=N runs seed N alone
			continue
		}
		rng := rand.New(rand.NewPCG(seed, 0x3a1))
		mode := SyncAlways
		if seed%4 == 3 {
			mode = SyncNone
		}
		opts := Options{Sync: mode, SegmentBytes: int64(512 + rng.IntN(2048))}
		fs := vfs.NewFaultFS()
		m := newCrashModel(t, mode)
		for round := range 4 {
			msg := fmt.Sprintf("seed %d round %d", seed, round)
			w := m.open(fs, opts, msg)
			fs.SetCrashPoint(int64(rng.IntN(80)))
			m.appendBursts(w, rng, 20)
			_ = w.Close()
			crash := rng.IntN(4)
			m.tracef("crash %d (0 partial entries, 1 keep all, else power loss), crash point reached %t", crash, fs.CrashPointReached())
			switch crash {
			case 0:
				fs.CrashPartialEntries(rng)
			case 1:
				fs.CrashKeepAll() // kill -9: the page cache survives
				m.mu.Lock()
				m.mustLSN = max(m.mustLSN, m.ackedLSN)
				m.mu.Unlock()
			default:
				fs.Crash(rng)
			}
		}
		m.open(fs, opts, fmt.Sprintf("seed %d final", seed)).Close()
	}
}

// TestFailKth fails the k-th write or sync (EIO) or fills the disk: the affected and later
// records fail, nothing unacknowledged is acknowledged, the WAL is fail-stop with the cause
// wrapped, and a reopen recovers (also across a later power loss).
func TestFailKth(t *testing.T) {
	type fault struct {
		name   string
		set    func(fs *vfs.FaultFS, k int)
		target error
	}
	faults := []fault{
		{"write", func(fs *vfs.FaultFS, k int) { fs.SetFailAt(vfs.OpWrite, k, nil) }, syscall.EIO},
		{"sync", func(fs *vfs.FaultFS, k int) { fs.SetFailAt(vfs.OpSync, k, nil) }, syscall.EIO},
		{"syncdir", func(fs *vfs.FaultFS, k int) { fs.SetFailAt(vfs.OpSyncDir, k, nil) }, syscall.EIO},
		{"create", func(fs *vfs.FaultFS, k int) { fs.SetFailAt(vfs.OpCreate, k, nil) }, syscall.EIO},
		{"enospc", func(fs *vfs.FaultFS, k int) { fs.SetCapacity(int64(k) * 300) }, syscall.ENOSPC},
	}
	for _, f := range faults {
		failures := 0
		for k := 1; k <= 30; k++ {
			msg := fmt.Sprintf("%s k=%d", f.name, k)
			rng := rand.New(rand.NewPCG(uint64(k), 7))
			fs := vfs.NewFaultFS()
			opts := Options{SegmentBytes: 1024}
			m := newCrashModel(t, SyncAlways)
			w := m.open(fs, opts, msg)
			f.set(fs, k)
			m.appendBursts(w, rng, 40)
			m.mu.Lock()
			failed := m.failedLSN != 0
			m.mu.Unlock()
			if !failed {
				require.NoError(t, w.Close(), msg)
				continue
			}
			failures++
			_, err := w.Append(t.Context(), 1, nil, false)
			require.ErrorIs(t, err, ErrFailStop, msg)
			require.ErrorIs(t, err, f.target, msg)
			require.ErrorIs(t, w.Sync(), ErrFailStop, msg)
			require.ErrorIs(t, w.AppendAsync(1, nil, true, func(uint64, error) {}), ErrFailStop, msg)
			require.ErrorIs(t, w.Close(), ErrFailStop, msg)

			fs.SetCapacity(0)
			fs.ResetFaults()
			w = m.open(fs, opts, msg+" reopen")
			m.appendBursts(w, rng, 10)
			require.NoError(t, w.Close(), msg)
			fs.Crash(rng)
			m.open(fs, opts, msg+" after crash").Close()
		}
		t.Logf("%s: %d of 30 runs failed", f.name, failures)
		require.Greater(t, failures, 3, f.name)
	}
}

// TestCrashEveryPoint runs one small workload and crashes it after every mutating file
// system operation in turn.
func TestCrashEveryPoint(t *testing.T) {
	opts := Options{SegmentBytes: 600}
	run := func(fs *vfs.FaultFS, m *crashModel) {
		w, _, err := openCollect(t, fs, opts)
		if err != nil {
			require.ErrorIs(t, err, vfs.ErrCrashed)
			return
		}
		for n := uint64(1); n <= 12; n++ {
			p := payloadOf(n)
			ch := make(chan error, 1)
			if w.AppendAsync(1, [][]byte{p}, false, func(lsn uint64, err error) {
				m.done(w, lsn, p, false, err)
				ch <- err
			}) != nil || <-ch != nil {
				break
			}
		}
		_ = w.Close()
	}
	probe := vfs.NewFaultFS()
	start := probe.Ops()
	run(probe, newCrashModel(t, SyncAlways))
	total := probe.Ops() - start
	require.Greater(t, total, int64(12))
	for k := range total + 1 {
		for seed := range uint64(4) {
			msg := fmt.Sprintf("crash point %d seed %d", k, seed)
			fs := vfs.NewFaultFS()
			m := newCrashModel(t, SyncAlways)
			fs.SetCrashPoint(k)
			run(fs, m)
			if seed > 0 {
				fs.Crash(rand.New(rand.NewPCG(seed, uint64(k))))
				require.NoError(t, m.open(fs, opts, msg).Close())
				continue
			}
			// kill -9, a run that appends, then a power loss that keeps nothing unsynced:
			// what the first reopen found and what the second run acknowledged survive.
			fs.CrashKeepAll()
			w := m.open(fs, opts, msg+" after kill")
			m.appendBursts(w, rand.New(rand.NewPCG(uint64(k), 1)), 3)
			require.NoError(t, w.Close())
			fs.Crash(nil)
			require.NoError(t, m.open(fs, opts, msg+" after power loss").Close())
		}
	}
}
