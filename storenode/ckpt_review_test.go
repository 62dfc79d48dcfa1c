package storenode

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/logicpage"
	"github.com/weftdb/weft/storenode/wal"
)

// A table dropped while a checkpoint copies its pages: the checkpoint skips the dropped
// table's dirty pages, so the meta file it publishes holds the table (it was live at the
// snapshot) with a page map missing commits at or below the checkpoint LSN, which recovery no
// longer replays. That is only right once the drop record, which recovery replays after the
// checkpoint LSN, is durable. Here the drop record's WAL write fails (so it never reaches the
// disk) while the checkpoint goes on, and the power is lost after: DropTable never succeeded,
// so the table must come back whole, with every acknowledged row.
// reviewChunks are lock holds small enough that the crash harnesses' checkpoints cross
// chunk boundaries.
var reviewChunks = ckptChunks{scanFrames: 2, copyBytes: 4096, installWrites: 1}

var errDropWriteLost = errors.New("test: the drop record's write is lost")

func TestCheckpointTableDroppedMidCheckpointKeepsRows(t *testing.T) {
	fs := vfs.NewFaultFS()
	opts := Options{Dir: "db", FS: fs, Logger: quietLogger, Sync: SyncAlways, CheckpointInterval: -1, CheckpointWALBytes: -1}
	e, err := Open(opts)
	require.NoError(t, err)
	info, err := e.CreateTable("t", 64)
	require.NoError(t, err)
	g, err := e.Acquire(info.ID, testOwner, 0)
	require.NoError(t, err)
	_, err = grantPages(e, info.ID, testOwner, g.Epoch, 1)
	require.NoError(t, err)
	commit := func(e *Engine, seq, id uint64) {
		ch := make(chan error, 1)
		e.Commit(batchOf(testOwner, seq, info.ID, g.Epoch, oneRow(info.ID, id, row64(100+id))), func(_ uint64, err error) { ch <- err })
		require.NoError(t, <-ch)
	}
	commit(e, 1, 0)
	require.NoError(t, e.Checkpoint()) // page 0 gets a disk copy
	require.NoError(t, e.Close())

	e, err = Open(opts)
	require.NoError(t, err)
	commit(e, 2, 1) // a partial frame: the checkpoint reads the disk copy, releasing mu

	dataFile := strings.TrimPrefix(dataFileName("db", info.ID), "/")
	var (
		mu         sync.Mutex
		holdRead   = true
		holdWAL    = false
		readHeld   = make(chan struct{})
		readGo     = make(chan struct{})
		walHeld    = make(chan struct{})
		walGo      = make(chan struct{})
		readSignal sync.Once
		walSignal  sync.Once
	)
	fs.Inject(func(op vfs.Op) error {
		mu.Lock()
		hr, hw := holdRead, holdWAL
		mu.Unlock()
		switch {
		case hr && op.Kind == vfs.OpRead && op.Name == dataFile:
			readSignal.Do(func() { close(readHeld) })
			<-readGo
		case hw && op.Kind == vfs.OpWrite && strings.HasPrefix(op.Name, "db/wal/"):
			walSignal.Do(func() { close(walHeld) })
			<-walGo
			return errDropWriteLost
		}
		return nil
	})
	ckptErr := make(chan error, 1)
	go func() { ckptErr <- e.Checkpoint() }()
	<-readHeld // the checkpoint took its snapshot and is merging the partial frame, mu released
	mu.Lock()
	holdRead, holdWAL = false, true
	mu.Unlock()
	dropErr := make(chan error, 1)
	go func() { dropErr <- e.DropTable("t", testOwner) }()
	<-walHeld // the drop record is logged (and the table removed under the same hold of mu), not written
	close(readGo)
	close(walGo) // the drop record's write fails: it never reaches the disk
	require.ErrorIs(t, <-dropErr, errDropWriteLost)
	_ = <-ckptErr // fails (the WAL failed) once it waits for the drop record, as it must
	_ = e.Close()
	fs.Crash(nil)
	fs.Inject(nil)

	e, err = Open(opts)
	require.NoError(t, err)
	defer e.Close()
	got, err := e.OpenTable("t")
	require.NoError(t, err, "the drop never became durable: the table is still there")
	require.Equal(t, info.ID, got.ID)
	for id := uint64(0); id < 2; id++ {
		row, ok := readRow(t, e, info.ID, id)
		require.True(t, ok, "acknowledged row %d lost", id)
		require.Equal(t, row64(100+id), row)
	}
}

// Check and replay agree on a WAL commit naming a row never granted by its clear mask alone,
// or by an empty segment on a page whose first id was never granted: replay refuses both
// (segmentLastID), so Check must report them as damage, not pass the store.
func TestCheckUngrantedClearOrEmptySegmentAgreesWithOpen(t *testing.T) {
	s := buildCheckStores(t)
	for _, seg := range []logicpage.Segment{{Page: 100, Clear: 1}, {Page: 100}} {
		dir := copyStore(t, s.clean)
		e, err := Open(checkTestOptions(dir))
		require.NoError(t, err)
		g, err := e.Acquire(1, checkOwner, 0)
		require.NoError(t, err)
		require.NoError(t, e.Close())
		b := &Batch{Owner: checkOwner, Seq: g.LastSeq + 1, Fences: []Fence{{Table: 1, Epoch: g.Epoch}},
			Segments: []Segment{{Table: 1, Segment: seg}}}
		log, err := wal.Open(vfs.Default, walDir(dir), wal.Options{}, nil)
		require.NoError(t, err)
		lsn, err := log.Append(context.Background(), kindCommit,
			[][]byte{appendCommitRecord(nil, b, batchHash(b), func(uint32) int { return 64 })}, false)
		require.NoError(t, err)
		require.NoError(t, log.Close())
		image := filepath.Join(t.TempDir(), "image")
		require.NoError(t, os.CopyFS(image, os.DirFS(dir)))
		file, offs := walRecordOffsets(t, image)
		rep := runCheck(t, image)
		requireOnly(t, rep, Finding{Damage: true, File: file, Offset: offs[lsn], Table: 1, Page: -1, DiskPage: -1, LSN: lsn},
			"names row 6400", "at or above the table's granted ids (next id 512)")
		_, err = Open(checkTestOptions(dir))
		require.ErrorIs(t, err, corrupt.ErrCorruption)
		require.ErrorContains(t, err, "row 6400 of table 1 was never granted")
	}
}
