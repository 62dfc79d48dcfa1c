package storenode

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/storenode/wal"
)

// TestExpiredRecordReplays: replay (a replica's reopen) accepts an expiry record (kind 19,
// which only a replica writes) and applies it as ApplyCommitted does: an owner whose last seq
// is the record's and that holds no table is dropped; one that still holds its table, one
// whose last seq moved on, and one unknown are kept or skipped. Check reads the record too.
func TestExpiredRecordReplays(t *testing.T) {
	fs := vfs.NewFaultFS()
	opts := Options{Dir: "db", FS: fs, CheckpointInterval: -1, CheckpointWALBytes: -1, OwnerExpiry: -1, Logger: quietLogger}
	e := openEngine(t, opts)
	commits := func(name string, owner uint64, n uint64) {
		ti, g := ownedTable(t, e, name, 64, owner, 1)
		for seq := uint64(1); seq <= n; seq++ {
			commitWait(t, e, &base.Batch{Owner: owner, Seq: seq, Fences: []base.Fence{{Table: ti.ID, Epoch: g.Epoch}},
				Segments: []base.Segment{oneRow(ti.ID, seq, row64(seq))}})
		}
	}
	commits("held", 7, 2)    // holds its table: kept
	commits("dropped", 8, 1) // its table dropped: expired
	commits("moved", 10, 2)  // the record names seq 1: kept
	require.NoError(t, e.DropTable("dropped", 8))
	require.NoError(t, e.DropTable("moved", 10))
	require.NoError(t, e.Close())

	log, err := wal.Open(fs, walDir("db"), wal.Options{}, nil)
	require.NoError(t, err)
	rec := appendExpiredRecord(nil, []expiredOwner{{owner: 7, seq: 2}, {owner: 8, seq: 1}, {owner: 9, seq: 1}, {owner: 10, seq: 1}})
	_, err = log.Append(context.Background(), kindExpired, [][]byte{rec}, false)
	require.NoError(t, err)
	require.NoError(t, log.Close())

	rep := requireChecked(t, context.Background(), "db", CheckOptions{FS: fs})
	require.False(t, rep.Damaged(), "%+v", rep.Findings)
	e = openEngine(t, opts)
	defer e.Close()
	e.mu.Lock()
	defer e.mu.Unlock()
	require.NotNil(t, e.owners[7], "the holder expired")
	require.Nil(t, e.owners[8], "the idle owner did not expire")
	require.NotNil(t, e.owners[10], "an owner whose seq moved on expired")
	require.Equal(t, uint64(2), e.owners[10].lastSeq)
	require.Nil(t, e.owners[9])
}
