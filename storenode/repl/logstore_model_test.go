package repl

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/weftdb/weft/internal/testseed"
	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/storenode/wal"
)

// TestLogStoreMatchesMemoryStorage runs random appends (with conflicting suffixes),
// HardStates, compactions and snapshots against raft.MemoryStorage, reopening the log store
// after every step: every method answers the same, before and after the reopen.
func TestLogStoreMatchesMemoryStorage(t *testing.T) {
	seeds := testseed.Scaled(4, 12, 200)
	for n := 0; n < seeds; n++ {
		seed := testseed.Seed(t)
		if only, ok := testseed.Replay(t); ok && seed != only {
			continue
		}
		t.Logf("seed %d", seed)
		runModel(t, seed, wal.SyncMode(n%2), testseed.Scaled(60, 150, 600))
	}
}

func runModel(t *testing.T, seed uint64, sync wal.SyncMode, steps int) {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	fsys := vfs.NewFaultFS()
	ms := raft.NewMemoryStorage()
	opts := smallOptions(fsys, sync)
	s := mustOpenStore(t, withSnapshot(opts, ms))
	defer func() { _ = s.Close() }()
	var hs raftpb.HardState
	for step := 0; step < steps; step++ {
		first, _ := ms.FirstIndex()
		last, _ := ms.LastIndex()
		var what string
		switch op := rng.IntN(10); {
		case op < 6: // append, maybe over a conflicting suffix, maybe with a HardState
			from := last + 1
			if rng.IntN(3) == 0 {
				from = first - min(first, 1) + rng.Uint64N(last+2-first+min(first, 1))
				from = max(from, 1)
			}
			prevTerm, err := ms.Term(from - 1)
			if err != nil {
				prevTerm = 1
			}
			term := max(prevTerm, hs.GetTerm(), 1) + rng.Uint64N(2)
			var ents []*raftpb.Entry
			for i := uint64(0); i < uint64(rng.IntN(6)); i++ {
				ents = append(ents, randEntry(rng, from+i, term))
			}
			var h *raftpb.HardState
			if rng.IntN(2) == 0 {
				nl := last
				if len(ents) > 0 {
					nl = ents[len(ents)-1].GetIndex()
				}
				hs = raftpb.HardState{Term: proto.Uint64(max(hs.GetTerm(), term)), Vote: proto.Uint64(rng.Uint64N(4)),
					Commit: proto.Uint64(max(hs.GetCommit(), min(nl, hs.GetCommit()+rng.Uint64N(3))))}
				h = &hs
				require.NoError(t, ms.SetHardState(proto.Clone(h).(*raftpb.HardState)))
			}
			require.NoError(t, ms.Append(ents))
			require.NoError(t, s.Append(ents, h, rng.IntN(4) == 0))
			what = describe("step %d: append %d entries at %d", step, len(ents), from)
		case op < 8: // compact
			if last < first {
				continue
			}
			i := first + rng.Uint64N(last-first+1)
			require.NoError(t, ms.Compact(i))
			require.NoError(t, s.Compact(i))
			what = describe("step %d: compact %d", step, i)
			require.ErrorIs(t, s.Compact(i), raft.ErrCompacted)
		case op < 9: // a snapshot of the state machine, then compact behind it
			snap, _ := ms.Snapshot()
			lo := max(snap.GetMetadata().GetIndex()+1, first-1)
			if last < lo || lo == 0 {
				continue
			}
			i := lo + rng.Uint64N(last-lo+1)
			cs := confState(rng)
			_, err := ms.CreateSnapshot(i, cs, nil)
			require.NoError(t, err)
			require.NoError(t, s.CreateSnapshot(i, cs))
			require.ErrorIs(t, s.CreateSnapshot(i, cs), raft.ErrSnapOutOfDate)
			what = describe("step %d: snapshot at %d", step, i)
		default: // a snapshot from the leader replaces the log
			snap, _ := ms.Snapshot()
			i := max(snap.GetMetadata().GetIndex(), last) + rng.Uint64N(5)
			if rng.IntN(2) == 0 {
				i = snap.GetMetadata().GetIndex() + 1 + rng.Uint64N(last+1-min(last, snap.GetMetadata().GetIndex()))
			}
			term, _ := ms.Term(last)
			st := &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: proto.Uint64(i), Term: proto.Uint64(max(term, hs.GetTerm(), 1)), ConfState: confState(rng)}}
			werr := ms.ApplySnapshot(st)
			gerr := s.ApplySnapshot(st)
			require.Equal(t, errClass(werr), errClass(gerr), "step %d: ApplySnapshot(%d)", step, i)
			what = describe("step %d: apply snapshot %d", step, i)
		}
		requireSameStorage(t, rng, ms, s, what)
		require.NoError(t, s.Close())
		s = mustOpenStore(t, withSnapshot(opts, ms))
		requireSameStorage(t, rng, ms, s, what+", reopened")
		s.mu.Lock()
		require.LessOrEqual(t, s.tailBytes, opts.TailBytes, "%s: tail over its bound", what)
		s.mu.Unlock()
	}
}
