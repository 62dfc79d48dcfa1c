package repl

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/storenode/wal"
)

// TestLogStoreTailIsBounded appends far more than the tail holds: the entries in memory stay
// within TailBytes, old entries are read back from the WAL (file reads seen), new ones from
// memory (none), and a reopen rebuilds a bounded tail too.
func TestLogStoreTailIsBounded(t *testing.T) {
	fsys := vfs.NewFaultFS()
	opts := Options{FS: fsys, Dir: testDir, WAL: wal.Options{Sync: wal.SyncNone, SegmentBytes: 64 << 10},
		TailBytes: 8 << 10, MarkBytes: 4 << 10}
	s := mustOpenStore(t, opts)
	defer func() { _ = s.Close() }()
	rng := rand.New(rand.NewPCG(1, 2))
	var all []*raftpb.Entry
	for i := uint64(1); i <= 3000; i += 10 {
		var ents []*raftpb.Entry
		for k := uint64(0); k < 10; k++ {
			ents = append(ents, &raftpb.Entry{Term: proto.Uint64(1 + i/1000), Index: proto.Uint64(i + k),
				Data: EncodeEntryData(6, i+k, randBytes(rng, 100))})
		}
		require.NoError(t, s.Append(ents, nil, false))
		all = append(all, ents...)
	}
	requireTailBounded := func(what string) {
		s.mu.Lock()
		defer s.mu.Unlock()
		require.LessOrEqual(t, s.tailBytes, opts.TailBytes, what)
		require.Less(t, len(s.tail), 100, what)
		require.Greater(t, s.tailFirst, uint64(2900), what)
	}
	requireTailBounded("after appends")

	var reads int
	fsys.Inject(func(op vfs.Op) error {
		if op.Kind == vfs.OpRead {
			reads++
		}
		return nil
	})
	check := func(lo, hi uint64) {
		got, err := s.Entries(lo, hi, ^uint64(0))
		require.NoError(t, err)
		require.Len(t, got, int(hi-lo))
		for k, e := range got {
			require.True(t, proto.Equal(all[lo-1+uint64(k)], e), "entry %d", lo+uint64(k))
		}
	}
	check(2990, 3001)
	require.Zero(t, reads, "the tail's entries come from memory")
	check(1, 50)
	require.Positive(t, reads, "old entries come from the WAL")
	reads = 0
	check(1500, 1600)
	check(2800, 3001) // from the WAL, then the tail
	require.Positive(t, reads)
	// A size limit: at least one entry, and raft's prefix rule.
	got, err := s.Entries(10, 3001, 1)
	require.NoError(t, err)
	require.Len(t, got, 1)
	one := uint64(proto.Size(all[0]))
	got, err = s.Entries(10, 3001, 3*one+one/2)
	require.NoError(t, err)
	require.Len(t, got, 3)
	fsys.Inject(nil)

	require.NoError(t, s.Close())
	s = mustOpenStore(t, opts)
	requireTailBounded("after a reopen")
	check(1, 3001)
}

// TestLogStoreOpenRefusesDamage: a bad record the log proves durable (a segment follows it)
// fails Open with corrupt.ErrCorruption and changes nothing, as the WAL's own rules say (torn
// tails: TestLogStoreCrashKeepsSynced).
func TestLogStoreOpenRefusesDamage(t *testing.T) {
	fsys := vfs.NewFaultFS()
	opts := smallOptions(fsys, wal.SyncAlways)
	s := mustOpenStore(t, opts)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := uint64(1); i <= 60; i++ {
		require.NoError(t, s.Append([]*raftpb.Entry{randEntry(rng, i, 1)}, nil, false))
	}
	require.NoError(t, s.Close())
	firsts, err := wal.SegmentFirsts(fsys, testDir)
	require.NoError(t, err)
	require.Greater(t, len(firsts), 2)
	name := testDir + "/" + segName(firsts[1])
	b, err := fsys.ReadFile(name)
	require.NoError(t, err)
	b[100] ^= 1
	require.NoError(t, fsys.WriteFile(name, b))
	_, err = Open(opts)
	require.ErrorIs(t, err, corrupt.ErrCorruption)
	b[100] ^= 1
	require.NoError(t, fsys.WriteFile(name, b))
	s = mustOpenStore(t, opts)
	last, _ := s.LastIndex()
	require.Equal(t, uint64(60), last)
	require.NoError(t, s.Close())
}

func segName(first uint64) string { return describe("wal-%016x.log", first) }

// TestLogStoreRefusesBadCalls: calls raft never makes are errors, not corruption.
func TestLogStoreRefusesBadCalls(t *testing.T) {
	s := mustOpenStore(t, smallOptions(vfs.NewFaultFS(), wal.SyncNone))
	defer func() { _ = s.Close() }()
	e := func(i uint64) *raftpb.Entry { return &raftpb.Entry{Term: proto.Uint64(1), Index: proto.Uint64(i)} }
	require.ErrorIs(t, s.Append([]*raftpb.Entry{e(2)}, nil, false), ErrBadAppend)
	require.ErrorIs(t, s.Append([]*raftpb.Entry{e(1), e(3)}, nil, false), ErrBadAppend)
	v1 := raftpb.EntryConfChange
	require.ErrorIs(t, s.Append([]*raftpb.Entry{{Term: proto.Uint64(1), Index: proto.Uint64(1), Type: &v1}}, nil, false), ErrBadEntry)
	require.ErrorIs(t, s.Append([]*raftpb.Entry{{Term: proto.Uint64(1), Index: proto.Uint64(1), Data: []byte("short")}}, nil, false), ErrBadEntry)
	require.NoError(t, s.Append([]*raftpb.Entry{e(1), e(2)}, nil, false))
	require.ErrorIs(t, s.Compact(3), ErrBadAppend)
	_, err := s.Entries(1, 4, 100)
	require.ErrorIs(t, err, ErrBadAppend)
	_, err = s.Term(3)
	require.True(t, errors.Is(err, raft.ErrUnavailable))
	require.NoError(t, s.Close())
	_, err = s.Entries(1, 2, 100)
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, s.Append([]*raftpb.Entry{e(3)}, nil, false), ErrClosed)
}
