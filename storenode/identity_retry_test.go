package storenode

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/internal/vfs"
)

// Defects found in the hostile review of issue 10's work, one regression test each.

// A retry of a batch that was durable before the engine failed is acknowledged, with its own
// LSN: a fail-stop later must not turn it into a definite failure (the application would
// take a durable batch for a lost one), and a retry of a batch whose outcome the failure
// left open is an unknown outcome, never a plain fail-stop. Fails on 767c454 and on the
// reviewed code, which answered both with ErrFailStop before looking at the dedup window.
func TestRetryAfterFailStopKeepsOutcome(t *testing.T) {
	e, fs, info, g := openFault(t, Options{}, testOwner)
	durable := batchOf(testOwner, 1, info.ID, g.Epoch, oneRow(info.ID, 1, row64(1)))
	lsn1 := commitWait(t, e, durable)

	fs.SetFailAt(vfs.OpSync, 1, nil)
	failed := batchOf(testOwner, 2, info.ID, g.Epoch, oneRow(info.ID, 2, row64(2)))
	_, err := e.CommitWait(failed)
	require.ErrorIs(t, err, ErrUnknownOutcome)
	require.ErrorIs(t, err, ErrFailStop)

	lsn, err := e.CommitWait(durable) // its acknowledgement was lost; it is durable
	require.NoError(t, err, "a durable batch retried after the fail-stop")
	require.Equal(t, lsn1, lsn)

	_, err = e.CommitWait(failed)
	require.ErrorIs(t, err, ErrUnknownOutcome, "its write failed: it may survive a restart")
	require.ErrorIs(t, err, ErrFailStop)

	other := batchOf(testOwner, 2, info.ID, g.Epoch, oneRow(info.ID, 3, row64(3)))
	_, err = e.CommitWait(other)
	require.ErrorIs(t, err, ErrSeqReused, "not the batch applied under seq 2")

	_, err = e.CommitWait(batchOf(testOwner, 3, info.ID, g.Epoch, oneRow(info.ID, 3, row64(3))))
	require.ErrorIs(t, err, ErrFailStop, "a new batch fails definitely")
	require.NotErrorIs(t, err, ErrUnknownOutcome)
}

// writeChain keeps the owner writing page 1 of a table: at every WAL fsync, before the fsync
// returns, it commits the owner's next batch to that page, so the page always has a write
// that is not durable yet, until stop is closed or for limit fsyncs once a reader waits.
type writeChain struct {
	e       *Engine
	table   uint32
	epoch   uint64
	limit   int
	stop    chan struct{}
	mu      sync.Mutex
	seq     uint64
	syncs   int
	errs    []error
	stopped bool
}

func startWriteChain(t *testing.T, e *Engine, fs *vfs.FaultFS, table uint32, epoch uint64, limit int) *writeChain {
	c := &writeChain{e: e, table: table, epoch: epoch, limit: limit, stop: make(chan struct{}), seq: 1}
	fs.Inject(func(op vfs.Op) error {
		if op.Kind != vfs.OpSync || !strings.Contains(op.Name, "wal/") {
			return nil
		}
		c.mu.Lock()
		select {
		case <-c.stop:
			c.stopped = true
		default:
		}
		if c.stopped || c.syncs >= c.limit {
			c.mu.Unlock()
			return nil
		}
		e.ackMu.Lock()
		readerWaits := e.durableCh != nil
		e.ackMu.Unlock()
		if readerWaits {
			c.syncs++ // counted from the reader's first wait on
		}
		c.seq++
		b := batchOf(testOwner, c.seq, c.table, c.epoch, oneRow(c.table, 64+c.seq%64, row64(c.seq)))
		c.mu.Unlock()
		// Commit from another goroutine (this is the WAL's): it returns once the batch is
		// applied and handed to the WAL, unless a reader holds the engine back until the
		// fsync returns, which the engine counts (readBarriers): then it waits for the read.
		returned := make(chan struct{})
		go func() {
			e.Commit(b, func(_ uint64, err error) {
				if err != nil {
					c.mu.Lock()
					c.errs = append(c.errs, err)
					c.mu.Unlock()
				}
			})
			close(returned)
		}()
		for {
			select {
			case <-returned:
				return nil
			default:
			}
			if e.readBarriers.Load() != 0 {
				return nil
			}
			runtime.Gosched()
		}
	})
	// The first batch starts the chain.
	commitWait(t, e, batchOf(testOwner, 1, table, epoch, oneRow(table, 64, row64(1))))
	return c
}

func (c *writeChain) end(t *testing.T) (syncs int) {
	c.mu.Lock()
	close(c.stop)
	syncs = c.syncs
	errs := c.errs
	c.mu.Unlock()
	require.Empty(t, errs)
	return syncs
}

// A reader that is not the table's holder is answered while the owner writes the page (the
// table) without a pause: its wait for durability is bounded. Fails before the fix, where
// ReadRowsAs and PageDirAs waited for the frame's (table's) newest LSN again after every
// fsync and returned only once the writes stopped.
func TestNonOwnerReadNotStarvedByWrites(t *testing.T) {
	const limit = 300
	for _, what := range []string{"ReadRowsAs", "PageDirAs"} {
		t.Run(what, func(t *testing.T) {
			e, fs, info, g := openFault(t, Options{}, testOwner)
			chain := startWriteChain(t, e, fs, info.ID, g.Epoch, limit)
			done := make(chan error, 1)
			go func() {
				var err error
				if what == "ReadRowsAs" {
					var data uint64
					data, _, _, err = e.ReadRowsAs(testOwner+1, info.ID, 1, 1, nil)
					if err == nil && data != 1 {
						err = fmt.Errorf("row 64 missing: data %#x", data)
					}
				} else {
					var pages []PageInfo
					pages, _, err = e.PageDirAs(testOwner+1, info.ID, 0, 10, 0, nil)
					if err == nil && len(pages) != 1 {
						err = fmt.Errorf("%d pages", len(pages))
					}
				}
				done <- err
			}()
			require.NoError(t, waitErr(t, done, what))
			syncs := chain.end(t)
			require.Less(t, syncs, limit, "the read returned only once the owner stopped writing")
		})
	}
}

// A checkpoint taken inside replay keeps the synced LSN the previous meta file proved: the
// records up to it had been durable, and a bad one among them must stay corruption at the next
// recovery, not a torn tail that drops acknowledged batches. Fails before the fix, whose
// replay checkpoint published its own checkpoint LSN as the synced LSN.
func TestReplayCheckpointKeepsSyncedLSN(t *testing.T) {
	fs, opts, e, info, g := openRowOneStore(t, testOwner)

	// Batches acknowledged while the checkpoint syncs its data file: the meta file's synced
	// LSN covers them, its checkpoint LSN does not.
	const n = 10
	var once sync.Once
	var hookErr error
	fs.Inject(func(op vfs.Op) error {
		if op.Kind == vfs.OpSync && strings.Contains(op.Name, "table-") {
			once.Do(func() {
				done := make(chan error, 1)
				go func() {
					for i := range uint64(n) {
						page := 10 + i
						if _, err := e.CommitWait(batchOf(testOwner, 2+i, info.ID, g.Epoch, oneRow(info.ID, page*64, row64(page)))); err != nil {
							done <- err
							return
						}
					}
					done <- nil
				}()
				hookErr = <-done
			})
		}
		return nil
	})
	require.NoError(t, e.Checkpoint())
	require.NoError(t, hookErr)
	m, _, err := loadMeta(fs, "db")
	require.NoError(t, err)
	last := e.lastLSN
	require.Equal(t, last, m.syncedLSN)
	require.Less(t, m.ckptLSN+n-1, m.syncedLSN)

	// stopNoCheckpoint makes the engine fail-stop (a checkpoint's data write fails), so Close
	// publishes nothing more: the WAL after the checkpoint LSN stays to be replayed.
	stopNoCheckpoint := func(e *Engine) {
		fs.Inject(nil)
		fs.SetFailAt(vfs.OpWrite, 1, nil)
		require.Error(t, e.Checkpoint())
		e.Close()
		fs.ResetFaults()
		fs.CrashKeepAll()
	}
	stopNoCheckpoint(e)

	// Replay with a small cache checkpoints between records.
	opts.CacheBytes = 32 << 10
	e2 := openEngine(t, opts)
	m2, _, err := loadMeta(fs, "db")
	require.NoError(t, err)
	require.Greater(t, m2.ckptLSN, m.ckptLSN, "replay checkpointed")
	require.Less(t, m2.ckptLSN, last)
	require.GreaterOrEqual(t, m2.syncedLSN, last, "the replay checkpoint keeps what the previous meta proved durable")
	stopNoCheckpoint(e2)

	// Bit rot in the last record, acknowledged and synced: corruption, never a torn tail.
	names, err := fs.List("db/wal")
	require.NoError(t, err)
	seg := "db/wal/" + names[len(names)-1]
	b, err := fs.ReadFile(seg)
	require.NoError(t, err)
	b[len(b)-48] ^= 0x10
	require.NoError(t, fs.WriteFile(seg, b))
	_, err = Open(opts)
	require.ErrorIs(t, err, corrupt.ErrCorruption)
}
