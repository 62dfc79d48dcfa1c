package storenode

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/testseed"
	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/logicpage"
)

// Checkpoints that run back to back while committers write: every acknowledged row survives
// (read back live and after a reopen), the engine's invariants hold after each checkpoint, and
// the copies a checkpoint takes in chunks with the lock released between them never mix up
// pages. A small cache makes commits create partial frames (merged with their disk copies by
// the checkpoint) and wait for checkpoints to make room. Run with -race -short.
func TestCheckpointConcurrentCommits(t *testing.T) {
	for _, mode := range []SyncMode{SyncNone, SyncAlways} {
		t.Run(fmt.Sprintf("sync=%s", mode), func(t *testing.T) { testCheckpointConcurrentCommits(t, mode) })
	}
}

func testCheckpointConcurrentCommits(t *testing.T, mode SyncMode) {
	const committers = 4
	pages := uint64(testseed.Scaled(96, 400, 2000))
	commitsEach := testseed.Scaled(150, 1500, 20000)
	fs := vfs.NewFaultFS()
	opts := Options{Dir: "db", FS: fs, Logger: quietLogger, Sync: mode, CheckpointInterval: -1, CheckpointWALBytes: -1,
		CacheBytes: int64(pages/3) * (4096 + frameOverheadBytes)}
	e := openEngine(t, opts)
	// Small chunks: every checkpoint crosses many chunk boundaries, with commits between.
	e.ckptChunk = ckptChunks{scanFrames: 5, copyBytes: 3 * 4096, installWrites: 2}
	info, err := e.CreateTable("t", 64)
	require.NoError(t, err)
	g := acquire(t, e, info.ID, testOwner, 0)
	_, err = grantPages(e, info.ID, testOwner, g.Epoch, int(pages))
	require.NoError(t, err)

	rows := pages * logicpage.RowsPerPage
	latest := make([]uint64, rows) // row id -> last acknowledged version (0: never written)
	var (
		seqMu sync.Mutex
		seq   uint64
		wg    sync.WaitGroup
		errs  = make(chan error, committers+1)
		done  = make(chan struct{})
		tick  = make(chan struct{}, 1) // a committer's 25 more commits: time for a checkpoint
	)
	for w := range committers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			row := make([]byte, 64)
			for i := range commitsEach {
				// Committer w owns the rows id % committers == w: its own acks order them.
				id := (uint64(i)*7919*committers + uint64(w)) % rows
				id = id - id%committers + uint64(w)
				if id >= rows {
					continue
				}
				version := uint64(i + 1)
				binary.LittleEndian.PutUint64(row, id)
				binary.LittleEndian.PutUint64(row[8:], version)
				ch := make(chan error, 1)
				seqMu.Lock()
				seq++
				e.Commit(batchOf(testOwner, seq, info.ID, g.Epoch, oneRow(info.ID, id, row)), func(_ uint64, err error) { ch <- err })
				seqMu.Unlock()
				if err := <-ch; err != nil {
					errs <- fmt.Errorf("commit of row %d: %w", id, err)
					return
				}
				latest[id] = version
				if i%25 == 24 {
					select {
					case tick <- struct{}{}:
					default:
					}
				}
			}
		}()
	}
	var ckpts int
	var ckptWG sync.WaitGroup
	ckptWG.Add(1)
	go func() {
		defer ckptWG.Done()
		for {
			select {
			case <-done:
				return
			case <-tick:
			}
			if err := e.Checkpoint(); err != nil {
				errs <- err
				return
			}
			if err := e.verify(); err != nil {
				errs <- fmt.Errorf("after checkpoint %d: %w", ckpts, err)
				return
			}
			ckpts++
		}
	}()
	wg.Wait()
	close(done)
	ckptWG.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Positive(t, ckpts, "checkpoints ran beside the commits")
	st := e.Stats()
	t.Logf("%d checkpoints beside %d commits, %d pages written", ckpts, committers*commitsEach, st.CheckpointPages)

	check := func(e *Engine) {
		t.Helper()
		for page := range pages {
			data, _, got, err := e.ReadRows(info.ID, page, ^uint64(0), nil)
			require.NoError(t, err)
			for k, m := 0, data; m != 0; m &= m - 1 {
				slot := uint64(bits.TrailingZeros64(m))
				id := page*logicpage.RowsPerPage + slot
				r := got[k*64 : (k+1)*64]
				require.Equal(t, id, binary.LittleEndian.Uint64(r), "row %d holds another row's bytes", id)
				require.Equal(t, latest[id], binary.LittleEndian.Uint64(r[8:]), "row %d version", id)
				k++
			}
			for slot := range uint64(logicpage.RowsPerPage) {
				id := page*logicpage.RowsPerPage + slot
				require.Equal(t, latest[id] != 0, data&(1<<slot) != 0, "row %d present", id)
			}
		}
	}
	check(e)
	require.NoError(t, e.Close())
	e2 := openEngine(t, opts)
	defer e2.Close()
	check(e2)
}
