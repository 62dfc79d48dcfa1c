//go:build !race

package storenode

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/commitbody"
	"github.com/weftdb/weft/internal/vfs"
)

// The commit path hashes every batch for the dedup window: that allocates nothing.
func TestBatchHashAllocs(t *testing.T) {
	rows := make([]byte, 10*64)
	b := &base.Batch{Owner: 1, Seq: 2, Fences: []base.Fence{{Table: 1, Epoch: 2}}, Segments: []base.Segment{
		{Table: 1, Data: 1023, Rows: rows}, {Table: 1, Page: 1, Clear: 1}}}
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
		b := &base.Batch{Owner: testOwner, Fences: []base.Fence{{Table: info.ID, Epoch: g.Epoch}},
			Segments: []base.Segment{oneRow(info.ID, 65, row64(1))}}
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

// TestCommitKeptAllocs: a warm commit whose rows the WAL writes from the batch (a run of 256
// bytes or more: a kept piece, one pwritev per group on the real file system, one WriteAt
// per piece on a FaultFS) or whose received Commit body it logs (Batch.Body) allocates
// nothing either, in both sync modes (on the real file system, the fdatasync of every group
// included).
func TestCommitKeptAllocs(t *testing.T) {
	for _, c := range []struct {
		mode SyncMode
		fs   vfs.FS
	}{{SyncNone, nil}, {SyncAlways, nil}, {SyncNone, vfs.NewFaultFS()}, {SyncAlways, vfs.NewFaultFS()}} {
		mode := c.mode
		for _, withBody := range []bool{false, true} {
			e := openEngine(t, Options{Dir: t.TempDir(), FS: c.fs, Sync: mode, Logger: quietLogger, CheckpointInterval: -1})
			info, g := ownedTable(t, e, "t", 512, testOwner, 1)
			ch := make(chan error, 1)
			done := func(_ uint64, err error) { ch <- err }
			rows := make([]byte, 2*512)
			b := &base.Batch{Owner: testOwner, Seq: g.LastSeq, Fences: []base.Fence{{Table: info.ID, Epoch: g.Epoch}},
				Segments: []base.Segment{{Table: info.ID, Page: 0, Data: 0b110, Rows: rows}}}
			var body []byte
			commit := func() {
				b.Seq++
				if withBody {
					body = commitbody.AppendHeader(body[:0], b.Owner, b.Seq, 1, 1)
					body = commitbody.AppendFence(body, info.ID, g.Epoch)
					body = commitbody.AppendSegmentHeader(body, info.ID, 512, 0, 0b110, 0)
					body = append(body, rows...)
					b.Body = body
				}
				e.Commit(b, done)
				require.NoError(t, <-ch)
			}
			for range 100 {
				commit()
			}
			require.Zero(t, testing.AllocsPerRun(1000, commit), "sync %s, fault fs %v, body %v", mode, c.fs != nil, withBody)
			require.NoError(t, e.Close())
		}
	}
}
