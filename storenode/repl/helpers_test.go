package repl

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/storenode/wal"
)

const testDir = "node/raftlog"

// smallOptions makes segments roll, marks and the tail small, so that reads go to disk and
// compactions drop segments.
func smallOptions(fsys vfs.FS, sync wal.SyncMode) Options {
	return Options{
		FS: fsys, Dir: testDir,
		WAL:       wal.Options{Sync: sync, SegmentBytes: 2 << 10},
		TailBytes: 600, MarkBytes: 300,
	}
}

// randEntry returns a normalised entry (as the log store gives them back) of index i, term.
func randEntry(rng *rand.Rand, i, term uint64) *raftpb.Entry {
	e := &raftpb.Entry{Term: proto.Uint64(term), Index: proto.Uint64(i)}
	switch rng.IntN(8) {
	case 0: // a new leader's empty entry
	case 1:
		t := raftpb.EntryConfChangeV2
		e.Type = &t
		if n := rng.IntN(20); n > 0 {
			e.Data = randBytes(rng, n)
		}
	default:
		e.Data = EncodeEntryData(byte(1+rng.IntN(int(engineKindMax))), rng.Uint64(), randBytes(rng, rng.IntN(120)))
	}
	return e
}

func randBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// errClass names a Storage error for comparisons.
func errClass(err error) string {
	switch {
	case err == nil:
		return "nil"
	case errors.Is(err, raft.ErrCompacted):
		return "compacted"
	case errors.Is(err, raft.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, raft.ErrSnapOutOfDate):
		return "snap-out-of-date"
	}
	return "other: " + err.Error()
}

// requireSameStorage checks that every method of got answers as want's does, for indexes
// around the log and random Entries ranges and sizes.
func requireSameStorage(t *testing.T, rng *rand.Rand, want *raft.MemoryStorage, got *LogStore, what string) {
	t.Helper()
	wf, _ := want.FirstIndex()
	gf, _ := got.FirstIndex()
	require.Equal(t, wf, gf, "%s: FirstIndex", what)
	wl, _ := want.LastIndex()
	gl, _ := got.LastIndex()
	require.Equal(t, wl, gl, "%s: LastIndex", what)
	for i := wf - min(wf, 2); i <= wl+1; i++ {
		wt, werr := want.Term(i)
		gt, gerr := got.Term(i)
		require.Equal(t, errClass(werr), errClass(gerr), "%s: Term(%d) error", what, i)
		require.Equal(t, wt, gt, "%s: Term(%d)", what, i)
	}
	whs, wcs, _ := want.InitialState()
	ghs, gcs, err := got.InitialState()
	require.NoError(t, err)
	require.Equal(t, [3]uint64{whs.GetTerm(), whs.GetVote(), whs.GetCommit()}, [3]uint64{ghs.GetTerm(), ghs.GetVote(), ghs.GetCommit()}, "%s: HardState", what)
	require.True(t, proto.Equal(raftpb.EnsureConfState(proto.Clone(wcs).(*raftpb.ConfState)), raftpb.EnsureConfState(gcs)), "%s: ConfState %v, want %v", what, gcs, wcs)
	ws, _ := want.Snapshot()
	gs, _ := got.Snapshot()
	require.Equal(t, ws.GetMetadata().GetIndex(), gs.GetMetadata().GetIndex(), "%s: snapshot index", what)
	require.Equal(t, ws.GetMetadata().GetTerm(), gs.GetMetadata().GetTerm(), "%s: snapshot term", what)
	require.True(t, proto.Equal(ws.GetMetadata().GetConfState(), raftpb.EnsureConfState(gs.GetMetadata().GetConfState())), "%s: snapshot ConfState", what)
	ranges := [][3]uint64{{wf - 1, wl + 1, ^uint64(0)}, {wf, wl + 1, ^uint64(0)}, {wf, wl + 1, 0}}
	for k := 0; k < 6; k++ {
		lo := wf - min(wf, 1) + rng.Uint64N(wl-wf+3)
		hi := lo + rng.Uint64N(wl+2-min(lo, wl+1))
		ranges = append(ranges, [3]uint64{lo, min(hi, wl+1), rng.Uint64N(600)})
	}
	for _, r := range ranges {
		if r[0] == 0 || r[1] < r[0] {
			continue
		}
		we, werr := want.Entries(r[0], r[1], r[2])
		ge, gerr := got.Entries(r[0], r[1], r[2])
		require.Equal(t, errClass(werr), errClass(gerr), "%s: Entries(%d, %d, %d) error", what, r[0], r[1], r[2])
		require.Equal(t, len(we), len(ge), "%s: Entries(%d, %d, %d)", what, r[0], r[1], r[2])
		for k := range we {
			require.True(t, proto.Equal(we[k], ge[k]), "%s: Entries(%d, %d, %d)[%d] = %v, want %v", what, r[0], r[1], r[2], k, ge[k], we[k])
		}
	}
}

func mustOpenStore(t *testing.T, opts Options) *LogStore {
	t.Helper()
	s, err := Open(opts)
	require.NoError(t, err)
	return s
}

// withSnapshot returns opts with the snapshot of ms, as the engine's meta would give it.
func withSnapshot(opts Options, ms *raft.MemoryStorage) Options {
	snap, _ := ms.Snapshot()
	opts.SnapshotIndex = snap.GetMetadata().GetIndex()
	opts.SnapshotTerm = snap.GetMetadata().GetTerm()
	opts.ConfState = snap.GetMetadata().GetConfState()
	return opts
}

func confState(rng *rand.Rand) *raftpb.ConfState {
	cs := &raftpb.ConfState{}
	for v := uint64(1); v <= 5; v++ {
		if rng.IntN(2) == 0 {
			cs.Voters = append(cs.Voters, v)
		}
	}
	return cs
}

func describe(format string, args ...any) string { return fmt.Sprintf(format, args...) }
