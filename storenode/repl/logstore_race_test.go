package repl

import (
	"bytes"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/storenode/wal"
)

// TestLogStoreReadsWhileAppending reads (entries from the WAL and the tail, terms) while one
// goroutine appends, truncates and compacts: every answer is a consistent log (the entry of
// index i and term t has the data of (i, t)), or raft.ErrCompacted.
func TestLogStoreReadsWhileAppending(t *testing.T) {
	s := mustOpenStore(t, smallOptions(vfs.NewFaultFS(), wal.SyncNone))
	defer func() { _ = s.Close() }()
	entry := func(i, term uint64) *raftpb.Entry {
		return &raftpb.Entry{Term: proto.Uint64(term), Index: proto.Uint64(i),
			Data: EncodeEntryData(6, i*1000+term, bytes.Repeat([]byte{byte(i)}, int(i%50)))}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	var writeErr error
	compactions := 0
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(done)
		term := uint64(1)
		for n, i := 0, uint64(1); i <= 1500; n++ {
			if n%5 == 4 {
				i -= 3 // a conflicting suffix, rewritten in a new term
				term++
			}
			if writeErr = s.Append([]*raftpb.Entry{entry(i, term), entry(i+1, term)}, nil, false); writeErr != nil {
				return
			}
			i += 2
			if first, _ := s.FirstIndex(); n%40 == 39 && i > first+60 {
				if writeErr = s.Compact(first + 50); writeErr != nil {
					return
				}
				compactions++
			}
		}
	}()
	reads := 0
	for running := true; running; reads++ {
		select {
		case <-done:
			running = false
		default:
		}
		first, _ := s.FirstIndex()
		last, _ := s.LastIndex()
		if last < first {
			continue
		}
		ents, err := s.Entries(first, last+1, 4<<10)
		if errors.Is(err, raft.ErrCompacted) {
			continue
		}
		if errors.Is(err, ErrBadAppend) {
			continue // a truncation since LastIndex (raft never asks past what it wrote)
		}
		require.NoError(t, err)
		for k, e := range ents {
			require.Equal(t, first+uint64(k), e.GetIndex())
			require.True(t, proto.Equal(entry(e.GetIndex(), e.GetTerm()), e), "entry %d", e.GetIndex())
			if k > 0 {
				require.LessOrEqual(t, ents[k-1].GetTerm(), e.GetTerm())
			}
		}
	}
	wg.Wait()
	require.NoError(t, writeErr)
	require.Positive(t, compactions)
	require.Positive(t, reads)
}
