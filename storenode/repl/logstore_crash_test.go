package repl

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/weftdb/weft/internal/testseed"
	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/storenode/wal"
)

// logModel is a log store's state as a test sees it: the compaction point, the live entries
// after it, the HardState.
type logModel struct {
	dummy, dummyTerm uint64
	ents             []*raftpb.Entry
	hs               [3]uint64
}

func (m logModel) last() uint64 { return m.dummy + uint64(len(m.ents)) }

func (m logModel) term(i uint64) uint64 {
	if i == m.dummy {
		return m.dummyTerm
	}
	return m.ents[i-m.dummy-1].GetTerm()
}

// requireModel checks that s holds exactly m.
func requireModel(t *testing.T, s *LogStore, m logModel, what string) {
	t.Helper()
	require.True(t, sameAsModel(s, m), "%s: log store %s, want %s", what, describeStore(s), describeModel(m))
}

func sameAsModel(s *LogStore, m logModel) bool {
	f, _ := s.FirstIndex()
	l, _ := s.LastIndex()
	dt, err := s.Term(m.dummy)
	hs, _, _ := s.InitialState()
	if f != m.dummy+1 || l != m.last() || err != nil || dt != m.dummyTerm ||
		[3]uint64{hs.GetTerm(), hs.GetVote(), hs.GetCommit()} != m.hs {
		return false
	}
	if len(m.ents) == 0 {
		return true
	}
	got, err := s.Entries(f, l+1, ^uint64(0))
	if err != nil || len(got) != len(m.ents) {
		return false
	}
	for k := range got {
		if !proto.Equal(got[k], m.ents[k]) {
			return false
		}
	}
	return true
}

func describeModel(m logModel) string {
	terms := make([]uint64, len(m.ents))
	for k, e := range m.ents {
		terms[k] = e.GetTerm()
	}
	return describe("{dummy %d/%d, terms %v, hs %v}", m.dummy, m.dummyTerm, terms, m.hs)
}

func describeStore(s *LogStore) string {
	f, _ := s.FirstIndex()
	l, _ := s.LastIndex()
	dt, _ := s.Term(f - 1)
	hs, _, _ := s.InitialState()
	var terms []uint64
	for i := f; i <= l; i++ {
		t, _ := s.Term(i)
		terms = append(terms, t)
	}
	return describe("{dummy %d/%d, terms %v, hs %v}", f-1, dt, terms, [3]uint64{hs.GetTerm(), hs.GetVote(), hs.GetCommit()})
}

// TestLogStoreCrashKeepsSynced appends (over conflicting suffixes too), compacts and crashes
// the file system: a power loss (any subset of the unsynced sectors kept), a kill -9, or a
// crash in the middle of an append. After each crash the reopened log store must be exactly
// one of the states the records written passed through, no older than the last synced one:
// what was synced survives, an unsynced suffix may vanish (whole records, in order), and
// nothing else is ever found.
func TestLogStoreCrashKeepsSynced(t *testing.T) {
	seeds := testseed.Scaled(10, 40, 400)
	lost := 0
	for n := 0; n < seeds; n++ {
		seed := testseed.Seed(t)
		if only, ok := testseed.Replay(t); ok && seed != only {
			continue
		}
		lost += runCrashes(t, seed, wal.SyncMode(n%2), testseed.Scaled(6, 12, 30))
	}
	if seeds >= 40 {
		require.Positive(t, lost, "no crash lost an unsynced suffix: the test does not test that")
	}
	t.Logf("%d crashes lost an unsynced suffix", lost)
}

// runCrashes runs one seed and returns how many crashes lost records that had been written.
func runCrashes(t *testing.T, seed uint64, sync wal.SyncMode, rounds int) (lost int) {
	rng := rand.New(rand.NewPCG(seed, 7))
	fsys := vfs.NewFaultFS()
	opts := smallOptions(fsys, sync)
	s := mustOpenStore(t, opts)
	defer func() { _ = s.Close() }()
	cur := logModel{}
	states, synced := []logModel{cur}, 0 // the states the records written went through
	history := describe("seed %d sync %v:", seed, sync)
	for round := 0; round < rounds; round++ {
		if cur.last() > cur.dummy && rng.IntN(3) == 0 {
			i := cur.dummy + 1 + rng.Uint64N(cur.last()-cur.dummy)
			require.NoError(t, s.Compact(i), history)
			cur.dummyTerm = cur.term(i)
			cur.ents = cur.ents[i-cur.dummy:]
			cur.dummy = i
			states, synced = []logModel{cur}, 0
			history += describe(" compact %d;", i)
		}
		crashPoint := rng.IntN(3) == 0
		if crashPoint {
			k := rng.Int64N(8)
			fsys.SetCrashPoint(k)
			history += describe(" crash point %d;", k)
		}
		for a := 0; a < 1+rng.IntN(6); a++ {
			from := cur.last() + 1
			if cur.last() > cur.dummy && rng.IntN(3) == 0 {
				from = cur.dummy + 1 + rng.Uint64N(cur.last()-cur.dummy)
			}
			term := max(cur.term(from-1), cur.hs[0], 1) + rng.Uint64N(2)
			var ents []*raftpb.Entry
			for i := uint64(0); i < uint64(rng.IntN(5)); i++ {
				ents = append(ents, randEntry(rng, from+i, term))
			}
			var hs *raftpb.HardState
			next := cur
			if len(ents) > 0 {
				next.ents = append(append([]*raftpb.Entry(nil), cur.ents[:from-cur.dummy-1]...), ents...)
			}
			var run []logModel // the states this append's records pass through
			if len(ents) > 0 && from <= cur.last() {
				cut := cur
				cut.ents = cur.ents[:from-cur.dummy-1]
				run = append(run, cut)
			}
			for k := range ents {
				st := next
				st.ents = next.ents[:int(from-cur.dummy-1)+k+1]
				run = append(run, st)
			}
			termVote := false
			if rng.IntN(2) == 0 {
				h := [3]uint64{max(cur.hs[0], term), rng.Uint64N(3), max(cur.hs[2], min(next.last(), cur.hs[2]+1))}
				if h != cur.hs {
					termVote = h[0] != cur.hs[0] || h[1] != cur.hs[1]
					next.hs = h
					run = append(run, next)
				}
				hs = &raftpb.HardState{Term: proto.Uint64(h[0]), Vote: proto.Uint64(h[1]), Commit: proto.Uint64(h[2])}
			}
			force := rng.IntN(4) == 0
			err := s.Append(ents, hs, force)
			states = append(states, run...)
			history += describe(" append %d at %d force %v hs %v: %v;", len(ents), from, force, hs != nil, err)
			if err != nil {
				require.True(t, crashPoint, "%s", history)
				break
			}
			cur = next
			if sync == wal.SyncAlways || force || termVote {
				synced = len(states) - 1
			}
		}
		// Crash: a power loss, or a kill -9 (everything written survives).
		written := len(states) - 1
		if rng.IntN(2) == 0 {
			fsys.Crash(rng)
			history += " power loss;"
		} else {
			fsys.CrashKeepAll()
			history += " kill -9;"
			if !crashPoint {
				synced = written
			}
		}
		_ = s.Close()
		var err error
		s, err = Open(opts)
		require.NoError(t, err, "%s", history)
		found := -1
		for j := len(states) - 1; j >= synced; j-- {
			if sameAsModel(s, states[j]) {
				found = j
				break
			}
		}
		require.GreaterOrEqual(t, found, 0, "%s\nrecovered %s; the last synced state %s, the last written %s",
			history, describeStore(s), describeModel(states[synced]), describeModel(states[written]))
		if found < written {
			lost++
		}
		// Recovery made what it found durable.
		cur = states[found]
		states, synced = []logModel{cur}, 0
		history += describe(" recovered state %d of %d;", found, written)
	}
	return lost
}
