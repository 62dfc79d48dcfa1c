package storenode

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/testkit"
	"github.com/weftdb/weft/internal/vfs"
)

// Owner identity and retries at the engine: the dedup window, fences before waits, the owners
// table, DropTable's lease, retries during fail-stop, and durable-only reads for non-owners.

// idWait bounds every wait of these tests.
const idWait = 20 * time.Second

// openFault opens an engine on a FaultFS in "db" with one 64-byte table held by owner.
func openFault(t *testing.T, opts Options, owner uint64) (*Engine, *vfs.FaultFS, base.TableInfo, base.Grant) {
	t.Helper()
	fs := vfs.NewFaultFS()
	opts.Dir, opts.FS, opts.Logger = "db", fs, quietLogger
	if opts.CheckpointInterval == 0 {
		opts.CheckpointInterval = -1
	}
	e := openEngine(t, opts)
	t.Cleanup(func() { e.Close() })
	info, g := ownedTable(t, e, "t", 64, owner, testGrantPages)
	requireGranted(t, e, info.ID, owner, g.Epoch)
	return e, fs, info, g
}

func batchOf(owner, seq uint64, table uint32, epoch uint64, segs ...base.Segment) *base.Batch {
	return &base.Batch{Owner: owner, Seq: seq, Fences: []base.Fence{{Table: table, Epoch: epoch}}, Segments: segs}
}

// commitAsync starts a Commit and returns the channel of its outcome.
func commitAsync(e *Engine, b *base.Batch) <-chan error {
	ch := make(chan error, 1)
	go func() {
		_, err := e.CommitWait(b)
		ch <- err
	}()
	return ch
}

func waitErr(t *testing.T, ch <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(idWait):
		t.Fatalf("%s did not return within %v", what, idWait)
		return nil
	}
}

// Two live transaction nodes with one owner id: B takes the table (a new epoch) and commits
// seq n+1; A's own seq n+1 must not be acknowledged as a retry: its bytes differ. Fails on
// 767c454, which acknowledged A's batch without applying it.
func TestStaleIncarnationSeqIsRejected(t *testing.T) {
	e := openTest(t, Options{})
	info, ga := ownedTable(t, e, "t", 64, testOwner, testGrantPages)
	for seq := uint64(1); seq <= 3; seq++ {
		commitWait(t, e, batchOf(testOwner, seq, info.ID, ga.Epoch, oneRow(info.ID, seq, row64(seq))))
	}
	gb, err := e.Acquire(info.ID, testOwner, 0) // node B, same owner id
	require.NoError(t, err)
	require.Equal(t, uint64(3), gb.LastSeq)
	commitWait(t, e, batchOf(testOwner, 4, info.ID, gb.Epoch, oneRow(info.ID, 10, row64(1000))))

	_, err = e.CommitWait(batchOf(testOwner, 4, info.ID, ga.Epoch, oneRow(info.ID, 10, row64(2000))))
	require.ErrorIs(t, err, ErrSeqReused, "A's seq 4 is not B's seq 4")
	require.ErrorIs(t, err, ErrFenced)
	row, ok := readRow(t, e, info.ID, 10)
	require.True(t, ok)
	require.Equal(t, row64(1000), row)
	// A's next seq is fenced before anything else.
	_, err = e.CommitWait(batchOf(testOwner, 5, info.ID, ga.Epoch, oneRow(info.ID, 11, row64(1))))
	require.ErrorIs(t, err, ErrFenced)
	require.NotContains(t, err.Error(), "epoch 2", "errors never name the holder's epoch")
}

// A retried batch is acknowledged with its own LSN (fails on 767c454, which answered with the
// owner's last LSN), also after its fences moved; a seq older than the window has an unknown
// outcome.
func TestRetryAckedWithOwnLSN(t *testing.T) {
	e := openTest(t, Options{Sync: SyncNone})
	info, g := ownedTable(t, e, "t", 64, testOwner, testGrantPages)
	var sent []*base.Batch
	var lsns []uint64
	for seq := uint64(1); seq <= dedupWindow+6; seq++ {
		b := batchOf(testOwner, seq, info.ID, g.Epoch, oneRow(info.ID, seq%100, row64(seq)))
		lsn := commitWait(t, e, b)
		sent, lsns = append(sent, b), append(lsns, lsn)
	}
	last := len(sent) - 1
	lsn := commitWait(t, e, sent[last-2])
	require.Equal(t, lsns[last-2], lsn, "the retried batch's own LSN")

	// The fences moved (a new grant to the same owner): the retry is still the same batch.
	acquire(t, e, info.ID, testOwner, 0)
	lsn = commitWait(t, e, sent[last])
	require.Equal(t, lsns[last], lsn)

	_, err := e.CommitWait(sent[0])
	require.ErrorIs(t, err, ErrUnknownOutcome, "seq 1 fell out of the window")
	require.Equal(t, uint64(2), e.Stats().RetriedBatches)

	// The window survives a checkpoint and a reopen, and replay.
	require.NoError(t, e.Checkpoint())
	commitWait(t, e, &base.Batch{Owner: testOwner, Seq: uint64(len(sent) + 1), Fences: []base.Fence{{Table: info.ID, Epoch: g.Epoch + 1}},
		Segments: []base.Segment{oneRow(info.ID, 1, row64(1))}})
	dir := e.dir
	require.NoError(t, e.Close())
	e2 := openTest(t, Options{Dir: dir, Sync: SyncNone})
	lsn = commitWait(t, e2, sent[last-1])
	require.Equal(t, lsns[last-1], lsn, "from the meta file")
	other := batchOf(testOwner, sent[last-1].Seq, info.ID, g.Epoch, oneRow(info.ID, 3, row64(3)))
	_, err = e2.CommitWait(other)
	require.ErrorIs(t, err, ErrSeqReused)
}

// A batch not yet applied is fence-checked before it waits for a seq gap: a stale owner is
// rejected at once. Fails on 767c454, which held it back for SeqGapWait first.
func TestFenceBeforeSeqGapWait(t *testing.T) {
	e := openTest(t, Options{SeqGapWait: time.Hour})
	info, g := ownedTable(t, e, "t", 64, testOwner, testGrantPages)
	commitWait(t, e, batchOf(testOwner, 1, info.ID, g.Epoch, oneRow(info.ID, 1, row64(1))))
	err := waitErr(t, commitAsync(e, batchOf(testOwner, 5, info.ID, g.Epoch+7, oneRow(info.ID, 2, row64(2)))), "stale commit")
	require.ErrorIs(t, err, ErrFenced)
	err = waitErr(t, commitAsync(e, batchOf(testOwner+1, 9, info.ID, g.Epoch, oneRow(info.ID, 2, row64(2)))), "other owner's commit")
	require.ErrorIs(t, err, ErrFenced)
}

// Only applied batches create owners; an owner that holds nothing and has been idle for
// OwnerExpiry is dropped with its window. Fails on 767c454, where every owner that sent a
// batch got a permanent entry.
func TestOwnersTableBounded(t *testing.T) {
	clock := &fakeClock{}
	e := openTest(t, Options{Now: clock.Now, OwnerExpiry: time.Hour})
	info, err := e.CreateTable("t", 64)
	require.NoError(t, err)
	for owner := uint64(100); owner < 110; owner++ {
		_, err := e.CommitWait(batchOf(owner, 1, info.ID, 1, oneRow(info.ID, 1, row64(1))))
		require.ErrorIs(t, err, ErrFenced)
	}
	require.Equal(t, 0, e.Stats().Owners, "rejected batches create no owner")

	ga := acquire(t, e, info.ID, 5, 0)
	requireGranted(t, e, info.ID, 5, ga.Epoch)
	commitWait(t, e, batchOf(5, 1, info.ID, ga.Epoch, oneRow(info.ID, 1, row64(1))))
	require.Equal(t, 1, e.Stats().Owners)
	require.NoError(t, e.Release(info.ID, 5, ga.Epoch))
	gb := acquire(t, e, info.ID, 6, 0)
	requireGranted(t, e, info.ID, 6, gb.Epoch)
	commitWait(t, e, batchOf(6, 1, info.ID, gb.Epoch, oneRow(info.ID, 2, row64(2))))

	clock.Advance(30 * time.Minute)
	require.NoError(t, e.Checkpoint())
	require.Equal(t, 2, e.Stats().Owners, "owner 5 idle for less than OwnerExpiry")
	clock.Advance(31 * time.Minute)
	commitWait(t, e, batchOf(6, 2, info.ID, gb.Epoch, oneRow(info.ID, 3, row64(3))))
	require.NoError(t, e.Checkpoint())
	st := e.Stats()
	require.Equal(t, 1, st.Owners, "owner 5 expired; owner 6 holds the table")
	require.Equal(t, uint64(1), st.OwnersExpired)

	dir := e.dir
	require.NoError(t, e.Close())
	e2 := openTest(t, Options{Dir: dir, Now: clock.Now, OwnerExpiry: time.Hour})
	require.Equal(t, 1, e2.Stats().Owners, "the meta file holds the owners that were kept")
	// The expired owner's batches are fenced: it holds nothing.
	_, err = e2.CommitWait(batchOf(5, 1, info.ID, ga.Epoch, oneRow(info.ID, 1, row64(9))))
	require.ErrorIs(t, err, ErrFenced)
}

// DropTable needs the table's lease, or no live owner. Fails on 767c454, where any session
// dropped a table another owner held.
func TestDropTableNeedsLease(t *testing.T) {
	clock := &fakeClock{}
	e := openTest(t, Options{Now: clock.Now, LeaseDuration: time.Minute})
	_, err := e.CreateTable("a", 64)
	require.NoError(t, err)
	ib, err := e.CreateTable("b", 64)
	require.NoError(t, err)
	ia, _ := e.OpenTable("a")
	acquire(t, e, ia.ID, 1, 0)
	acquire(t, e, ib.ID, 1, 0)

	err = e.DropTable("a", 2)
	require.ErrorIs(t, err, ErrTableOwned)
	require.NotContains(t, err.Error(), "owner 1")
	require.NoError(t, e.DropTable("a", 1), "the holder drops it")
	clock.Advance(2 * time.Minute)
	require.NoError(t, e.DropTable("b", 2), "no live owner")
}

// blockSyncs is testkit.BlockSyncs under the names this package's tests (move_test.go too)
// call it by, its waits bounded by idWait.
type blockSyncs struct{ *testkit.BlockSyncs }

func newBlockSyncs(fs *vfs.FaultFS) blockSyncs { return blockSyncs{testkit.NewBlockSyncs(fs)} }

func (b blockSyncs) release(fail bool)        { b.Release(fail) }
func (b blockSyncs) waitBlocked(t *testing.T) { t.Helper(); b.WaitBlocked(t, idWait) }

// readResult is what readRowAsync or pageDirAsync's read returned.
type readResult struct {
	data  uint64
	pages int
	err   error
}

// readRowAsync reads row 70 (page 1, slot 6) of table as reader in a goroutine; the channel
// gets the present-rows mask.
func readRowAsync(e *Engine, reader uint64, table uint32) chan readResult {
	rows := make(chan readResult, 1)
	go func() {
		data, _, _, err := e.ReadRowsAs(reader, table, 1, 1<<6, nil)
		rows <- readResult{data: data, err: err}
	}()
	return rows
}

// pageDirAsync reads the page directory of table's first 10 pages as reader in a goroutine;
// the channel gets how many pages it listed.
func pageDirAsync(e *Engine, reader uint64, table uint32) chan readResult {
	dir := make(chan readResult, 1)
	go func() {
		pages, _, err := e.PageDirAs(reader, table, 0, 10, 0, nil)
		dir <- readResult{pages: len(pages), err: err}
	}()
	return dir
}

// heldReadsDone checks, once the blocked fsync of commit (the batch writing row 70) was
// released, failed when fail is set, what the reads held behind it got: all failed with the
// fsync, or the row and its page. It reports whether the batch is durable (the test goes on).
func heldReadsDone(t *testing.T, fail bool, commit <-chan error, rows, dir chan readResult) bool {
	t.Helper()
	r := <-rows
	d := <-dir
	err := waitErr(t, commit, "the commit")
	if fail {
		require.Error(t, err)
		require.Error(t, r.err, "the row was never durable")
		require.Error(t, d.err)
		return false
	}
	require.NoError(t, err)
	require.NoError(t, r.err)
	require.Equal(t, uint64(1<<6), r.data)
	require.NoError(t, d.err)
	require.Equal(t, 1, d.pages)
	return true
}

// waitDurableWaiter spins (yielding) until ch has a result or the engine has a durability
// waiter (a retry or a non-owner read waiting for its LSN).
func waitDurableWaiter(t *testing.T, e *Engine, ready func() bool) {
	t.Helper()
	testkit.SpinUntil(t, idWait, "nothing waits for durability", func() bool {
		if ready() {
			return true
		}
		e.ackMu.Lock()
		defer e.ackMu.Unlock()
		return e.durableCh != nil || len(e.dupAcks) > 0
	})
}

// A retry of a batch whose fsync then fails gets the failure (an unknown outcome), never
// hangs. Fails on 767c454, where the retry waited for ever in dupAcks.
func TestRetryDuringFailStop(t *testing.T) {
	e, fs, info, g := openFault(t, Options{}, testOwner)
	block := newBlockSyncs(fs)
	b := batchOf(testOwner, 1, info.ID, g.Epoch, oneRow(info.ID, 1, row64(1)))
	first := commitAsync(e, b)
	block.waitBlocked(t)
	retry := commitAsync(e, b)
	waitDurableWaiter(t, e, func() bool { return len(retry) > 0 })
	block.release(true)

	err := waitErr(t, first, "the first send")
	require.ErrorIs(t, err, ErrUnknownOutcome, "its write failed: it may survive a restart")
	require.ErrorIs(t, err, ErrFailStop)
	err = waitErr(t, retry, "the retry")
	require.ErrorIs(t, err, ErrUnknownOutcome)
	// Later commits fail at once, definitely: nothing was written.
	_, err = e.CommitWait(batchOf(testOwner, 2, info.ID, g.Epoch, oneRow(info.ID, 2, row64(2))))
	require.ErrorIs(t, err, ErrFailStop)
	require.NotErrorIs(t, err, ErrUnknownOutcome)
	_, err = e.CommitWait(b)
	require.ErrorIs(t, err, ErrFailStop)
}

// A WAL write or fsync error reaches the caller as an unknown outcome; batches queued behind
// the failed group, never written, fail definitely. Fails on 767c454 (a plain fail-stop).
func TestWALErrorsAreUnknownOutcome(t *testing.T) {
	for _, kind := range []vfs.OpKind{vfs.OpSync, vfs.OpWrite} {
		t.Run(kind.String(), func(t *testing.T) {
			e, fs, info, g := openFault(t, Options{}, testOwner)
			fs.SetFailAt(kind, 1, nil)
			_, err := e.CommitWait(batchOf(testOwner, 1, info.ID, g.Epoch, oneRow(info.ID, 1, row64(1))))
			require.ErrorIs(t, err, ErrUnknownOutcome)
			require.ErrorIs(t, err, ErrFailStop)
		})
	}
}

// A reader that is not the table's holder is served only durable rows: it waits for the
// page's fsync, and after a failed one it gets the failure, never the row. Fails on 767c454,
// which returned the row while its fsync was running.
func TestNonOwnerReadsDurableOnly(t *testing.T) {
	for _, fail := range []bool{false, true} {
		name := map[bool]string{false: "sync-ok", true: "sync-fails"}[fail]
		t.Run(name, func(t *testing.T) {
			e, fs, info, g := openFault(t, Options{}, testOwner)
			block := newBlockSyncs(fs)
			commit := commitAsync(e, batchOf(testOwner, 1, info.ID, g.Epoch, oneRow(info.ID, 70, row64(70))))
			block.waitBlocked(t)

			// The owner reads its own write at once.
			data, _, _, err := e.ReadRowsAs(testOwner, info.ID, 1, 1<<6, nil)
			require.NoError(t, err)
			require.Equal(t, uint64(1<<6), data)

			rows := readRowAsync(e, testOwner+1, info.ID)
			waitDurableWaiter(t, e, func() bool { return len(rows) > 0 })
			dir := pageDirAsync(e, 0, info.ID)
			block.release(fail)
			if !heldReadsDone(t, fail, commit, rows, dir) {
				return
			}
		})
	}
}

// After ReleaseOwner, a late request of the released node (its traffic renews leases) does not
// take the tables back; a new claim of the id renews again.
func TestReleaseSurvivesLateTraffic(t *testing.T) {
	clock := &fakeClock{}
	e := openTest(t, Options{Now: clock.Now})
	info, err := e.CreateTable("t", 64)
	require.NoError(t, err)
	inc := Incarnation{1}
	require.NoError(t, e.Connect(9, inc, 100, func() {}))
	acquire(t, e, info.ID, 9, 0)
	require.ErrorIs(t, e.Connect(9, Incarnation{2}, 101, func() {}), ErrOwnerInUse)
	require.NoError(t, e.ReleaseOwner(9, 100))
	require.ErrorIs(t, e.ReleaseOwner(9, 555), ErrIdentityLost, "only the holding connection releases")
	e.Renew(9)
	_, err = e.Acquire(info.ID, 10, 0)
	require.NoError(t, err, "released: another owner gets the table at once")
	evicted := make(chan struct{})
	require.NoError(t, e.Connect(9, Incarnation{2}, 102, func() { close(evicted) }), "released: another incarnation at once")
	require.NoError(t, e.Connect(9, Incarnation{2}, 103, func() {}))
	select {
	case <-evicted:
	default:
		t.Fatal("a reconnect of the same incarnation closes its old connection")
	}
}

// TestTableOwnedAfterRestartSaysWhy: after a restart a table's lease starts afresh for its
// last holder (who may still be alive); another owner is refused with ErrTableOwned and told
// why it waits and that the holder's owner id takes the table back at once, as it does. The
// hint is only for a lease the restart began, not one its holder renewed since.
func TestTableOwnedAfterRestartSaysWhy(t *testing.T) {
	dir := t.TempDir()
	now := fakeClock{}
	e := openTest(t, Options{Dir: dir, Now: now.Now})
	info, err := e.CreateTable("t", 64)
	require.NoError(t, err)
	acquire(t, e, info.ID, 1, 0)
	_, err = e.Acquire(info.ID, 2, 0)
	require.ErrorIs(t, err, ErrTableOwned)
	require.NotContains(t, err.Error(), "restarts", "a lease granted since open has no restart hint")
	require.NoError(t, e.Close())

	e = openTest(t, Options{Dir: dir, Now: now.Now})
	_, err = e.Acquire(info.ID, 2, 0)
	require.ErrorIs(t, err, ErrTableOwned)
	require.Contains(t, err.Error(), "its lease restarted when this storage node opened")
	require.Contains(t, err.Error(), "Options.OwnerID")
	g, err := e.Acquire(info.ID, 1, 0)
	require.NoError(t, err, "the last holder's owner id takes its table back at once")
	requireGranted(t, e, info.ID, 1, g.Epoch)
}
