//go:build !race

package storenode

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/logicpage"
)

// The commit path hashes every batch for the dedup window: that allocates nothing.
func TestBatchHashAllocs(t *testing.T) {
	rows := make([]byte, 10*64)
	b := &Batch{Owner: 1, Seq: 2, Fences: []Fence{{1, 2}}, Segments: []Segment{
		{Table: 1, Segment: logicpage.Segment{Data: 1023, Rows: rows}}, {Table: 1, Segment: logicpage.Segment{Page: 1, Clear: 1}}}}
	require.Zero(t, testing.AllocsPerRun(100, func() { batchHash(b) }))
}

// TestCommitAllocs guards the engine's commit path: a warm commit allocates nothing (no
// closure per WAL record, no Masks moved to the heap by an assertion's arguments, no room
// signal per group), in both sync modes.
func TestCommitAllocs(t *testing.T) {
	for _, mode := range []SyncMode{SyncNone, SyncAlways} {
		e, _, info, g := openFault(t, Options{Sync: mode}, testOwner)
		ch := make(chan error, 1)
		done := func(_ uint64, err error) { ch <- err }
		b := &Batch{Owner: testOwner, Fences: []Fence{{Table: info.ID, Epoch: g.Epoch}},
			Segments: []Segment{oneRow(info.ID, 65, row64(1))}}
		commit := func() {
			b.Seq++
			e.Commit(b, done)
			require.NoError(t, <-ch)
		}
		for range 100 {
			commit()
		}
		require.Zero(t, testing.AllocsPerRun(1000, commit), "sync %s", mode)
	}
}
