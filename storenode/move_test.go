package storenode

import (
	"context"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/vfs"
)

// movePair is a source and a target engine holding one partition table each.
type movePair struct {
	v            *memVerifier
	src, dst     *Engine
	srcDir       string
	dstDir       string
	srcID, dstID uint32
	owner        uint64
	epoch        uint64
	seq          uint64
}

var moveLayout = base.ClusterLayout{Partitions: 2, StripePages: 1, Partition: 1}

func newMovePair(t *testing.T) *movePair {
	t.Helper()
	return newMovePairAt(t, nil)
}

// newMovePairAt is newMovePair with both engines on clock now (time.Now when nil).
func newMovePairAt(t *testing.T, now func() time.Time) *movePair {
	t.Helper()
	p := &movePair{v: newMemVerifier(), srcDir: t.TempDir(), dstDir: t.TempDir(), owner: 11}
	p.src = openTest(t, Options{Dir: p.srcDir, GrantVerifier: p.v, TxnResolveInterval: -1, Now: now})
	p.dst = openTest(t, Options{Dir: p.dstDir, GrantVerifier: p.v, TxnResolveInterval: -1, Now: now})
	name := base.PartitionTableName("acct", 1)
	ti, err := p.src.CreateClusterTable(name, 64, moveLayout)
	require.NoError(t, err)
	p.srcID = ti.ID
	ti, err = p.dst.CreateClusterTable(name, 64, moveLayout)
	require.NoError(t, err)
	p.dstID = ti.ID
	p.epoch = p.v.grant("acct", 1, p.owner)
	_, err = p.src.RegisterGrant(context.Background(), p.srcID, p.owner, p.epoch)
	require.NoError(t, err)
	for range 4 { // ids 64..127, 192..255, 320..383, 448..511: a stripe per grant
		_, _, err = p.src.AllocIDs(p.srcID, p.owner, p.epoch, 1)
		require.NoError(t, err)
	}
	return p
}

// put writes row id = v on the source as its owner.
func (p *movePair) put(id, v uint64) error {
	p.seq++
	_, err := p.src.CommitWait(&base.Batch{Owner: p.owner, Seq: p.seq, Fences: []base.Fence{{Table: p.srcID, Epoch: p.epoch}},
		Segments: []base.Segment{oneRow(p.srcID, id, row64(v))}})
	if err != nil {
		p.seq-- // not applied: the seq is free again
	}
	return err
}

// copyPages copies pages from the source's durable rows into the target's copy.
func (p *movePair) copyPages(t *testing.T, pages []uint64) {
	t.Helper()
	var segs []base.Segment
	for _, pg := range pages {
		data, _, rows, err := p.src.ReadRowsAs(0, p.srcID, pg, ^uint64(0), nil)
		require.NoError(t, err)
		segs = append(segs, base.Segment{Table: p.dstID, Page: pg, Data: data, Clear: ^data, Rows: rows})
	}
	if len(segs) > 0 {
		_, err := p.dst.MoveWrite(segs, 7)
		require.NoError(t, err)
	}
}

func (p *movePair) allPages(t *testing.T, e *Engine, id uint32) []uint64 {
	t.Helper()
	dir, _, err := e.PageDir(id, 0, 1<<20, 0, nil)
	require.NoError(t, err)
	var out []uint64
	for _, d := range dir {
		out = append(out, d.Page)
	}
	return out
}

// The whole engine side of a move: copy under writes, catch up from the mark, freeze,
// activate with a floor, retire; each state survives a crash, every row is on the copy.
func TestMoveEngineSteps(t *testing.T) {
	p := newMovePair(t)
	ids := []uint64{64, 65, 127, 192, 200}
	for i, id := range ids {
		require.NoError(t, p.put(id, uint64(100+i)))
	}
	require.NoError(t, p.dst.MoveBegin(p.dstID, 5))
	require.NoError(t, p.dst.MoveBegin(p.dstID, 5), "a retry")
	require.ErrorIs(t, p.dst.MoveBegin(p.dstID, 4), ErrFenced, "a mover that lost the move")
	_, err0 := p.dst.MoveWrite([]base.Segment{{Table: p.dstID, Page: 1, Clear: ^uint64(0)}}, 4)
	require.ErrorIs(t, err0, ErrFenced, "its late write")
	require.NoError(t, p.dst.MoveBegin(p.dstID, 6), "a mover that took the move over")
	_, err0 = p.dst.MoveWrite([]base.Segment{{Table: p.dstID, Page: 1, Clear: ^uint64(0)}}, 5)
	require.ErrorIs(t, err0, ErrFenced, "the old mover's late write")
	require.NoError(t, p.dst.MoveBegin(p.dstID, 5+2))
	// An incoming copy takes no grant and serves no untrusted read.
	e2 := p.v.grant("acct", 1, 22)
	_, err := p.dst.RegisterGrant(context.Background(), p.dstID, 22, e2)
	require.ErrorIs(t, err, ErrMoved)
	_, _, _, err = p.dst.ReadRowsAs(22, p.dstID, 1, 1, nil)
	require.ErrorIs(t, err, ErrMoved)

	token, err := p.src.MoveMark(p.srcID)
	require.NoError(t, err)
	p.copyPages(t, p.allPages(t, p.src, p.srcID))
	// Writes after the mark: an update, a delete (a whole page emptied), an insert.
	require.NoError(t, p.put(65, 900))
	p.seq++
	_, err = p.src.CommitWait(&base.Batch{Owner: p.owner, Seq: p.seq, Fences: []base.Fence{{Table: p.srcID, Epoch: p.epoch}},
		Segments: []base.Segment{deleteRow(p.srcID, 192), deleteRow(p.srcID, 200)}})
	require.NoError(t, err)
	require.NoError(t, p.put(321, 901))
	changed, more, err := p.src.MoveChanges(p.srcID, token, 0, nil)
	require.NoError(t, err)
	require.False(t, more)
	require.Equal(t, []uint64{1, 3, 5}, changed)
	p.copyPages(t, changed)
	changed, _, err = p.src.MoveChanges(p.srcID, token, 0, nil)
	require.NoError(t, err)
	require.Empty(t, changed, "handed out once")

	// Freeze: commits, id grants and grants refused; reads go on; the freeze survives a crash.
	next, err := p.src.MoveFreeze(p.srcID, 5)
	require.NoError(t, err)
	require.ErrorIs(t, p.put(66, 1), ErrMoved)
	_, _, err = p.src.AllocIDs(p.srcID, p.owner, p.epoch, 1)
	require.ErrorIs(t, err, ErrMoved)
	_, err = p.src.RegisterGrant(context.Background(), p.srcID, p.owner, p.epoch)
	require.ErrorIs(t, err, ErrMoved, "a renewal too")
	require.NoError(t, p.src.Checkpoint(), "the checkpoint carries the state")
	p.src.crashForTest()
	p.src = openTest(t, Options{Dir: p.srcDir, GrantVerifier: p.v, TxnResolveInterval: -1})
	require.ErrorIs(t, p.put(66, 1), ErrMoved, "a restarted source keeps the freeze")
	st, next2, err := p.src.MoveStatus(p.srcID)
	require.NoError(t, err)
	require.Equal(t, MoveFrozen, st)
	require.Equal(t, next, next2)
	_, _, err = p.src.MoveChanges(p.srcID, token, 0, nil)
	require.ErrorIs(t, err, ErrMoveLost, "the mark is memory only")

	// The target survives a crash mid-copy too (its move writes replayed).
	p.dst.crashForTest()
	p.dst = openTest(t, Options{Dir: p.dstDir, GrantVerifier: p.v, TxnResolveInterval: -1})
	st, _, err = p.dst.MoveStatus(p.dstID)
	require.NoError(t, err)
	require.Equal(t, MoveIncoming, st)

	// Final full pass (the mark was lost), then activation above the switch's revision.
	p.copyPages(t, p.allPages(t, p.src, p.srcID))
	for _, pg := range p.allPages(t, p.dst, p.dstID) {
		if !containsPage(p.allPages(t, p.src, p.srcID), pg) {
			p.copyPages(t, []uint64{pg})
		}
	}
	floor := p.v.grant("acct/switch", 0, 0) // the switch's revision
	require.NoError(t, p.dst.MoveActivate(p.dstID, 7, floor, next))
	require.NoError(t, p.dst.MoveActivate(p.dstID, 7, floor, next), "a retry")
	require.NoError(t, p.src.MoveRetire(p.srcID, 5))
	_, _, _, err = p.src.ReadRowsAs(0, p.srcID, 1, ^uint64(0), nil)
	require.ErrorIs(t, err, ErrMoved, "a retired copy serves nothing")

	// Every row is on the copy.
	for id, want := range map[uint64]uint64{64: 100, 65: 900, 127: 102, 321: 901} {
		row, ok := readRow(t, p.dst, p.dstID, id)
		require.True(t, ok, "row %d", id)
		require.Equal(t, row64(want), row, "row %d", id)
	}
	for _, id := range []uint64{192, 200} {
		_, ok := readRow(t, p.dst, p.dstID, id)
		require.False(t, ok, "deleted row %d", id)
	}
	// The old grant is below the floor; a grant after the switch is accepted and writes.
	_, err = p.dst.RegisterGrant(context.Background(), p.dstID, 22, e2)
	require.ErrorIs(t, err, ErrFenced)
	e3 := p.v.grant("acct", 1, 33)
	_, err = p.dst.RegisterGrant(context.Background(), p.dstID, 33, e3)
	require.NoError(t, err)
	ti, err := p.dst.OpenTable(base.PartitionTableName("acct", 1))
	require.NoError(t, err)
	require.GreaterOrEqual(t, ti.NextID, next)
	_, err = p.dst.CommitWait(&base.Batch{Owner: 33, Seq: 1, Fences: []base.Fence{{Table: p.dstID, Epoch: e3}},
		Segments: []base.Segment{oneRow(p.dstID, 64, row64(7))}})
	require.NoError(t, err)

	// Both survive crashes: retired stays retired, the copy stays live.
	require.NoError(t, p.src.Checkpoint())
	p.src.crashForTest()
	p.src = openTest(t, Options{Dir: p.srcDir, GrantVerifier: p.v, TxnResolveInterval: -1})
	st, _, err = p.src.MoveStatus(p.srcID)
	require.NoError(t, err)
	require.Equal(t, MoveRetired, st)
	p.dst.crashForTest()
	p.dst = openTest(t, Options{Dir: p.dstDir, GrantVerifier: p.v, TxnResolveInterval: -1})
	row, ok := readRow(t, p.dst, p.dstID, 64)
	require.True(t, ok)
	require.Equal(t, row64(7), row)
	for _, e := range []*Engine{p.src, p.dst} {
		dir := e.dir
		require.NoError(t, e.Close())
		rep, err := Check(context.Background(), dir, CheckOptions{})
		require.NoError(t, err)
		require.False(t, rep.Damaged(), "%+v", rep)
	}
}

func containsPage(pages []uint64, p uint64) bool {
	for _, q := range pages {
		if q == p {
			return true
		}
	}
	return false
}

// A partition with a transaction in doubt is not frozen (so not moved); once decided it is.
func TestMoveFreezeRefusedInDoubt(t *testing.T) {
	p := newMovePair(t)
	require.NoError(t, p.put(64, 1))
	p.seq++
	_, err := p.src.PrepareTxn(&base.TxnPrepare{Txn: txnID(1), Lease: 5, Batch: &base.Batch{Owner: p.owner, Seq: p.seq,
		Fences: []base.Fence{{Table: p.srcID, Epoch: p.epoch}}, Segments: []base.Segment{oneRow(p.srcID, 65, row64(2))}}})
	require.NoError(t, err)
	_, err = p.src.MoveFreeze(p.srcID, 5)
	require.ErrorIs(t, err, ErrTxnLocked)
	st, _, err := p.src.MoveStatus(p.srcID)
	require.NoError(t, err)
	require.Equal(t, MoveLive, st, "nothing frozen")
	require.NoError(t, p.src.ApplyTxn(txnID(1), base.DecisionAbort))
	_, err = p.src.MoveFreeze(p.srcID, 5)
	require.NoError(t, err)
	// Frozen: no transaction can be prepared on it.
	p.seq++
	_, err = p.src.PrepareTxn(&base.TxnPrepare{Txn: txnID(2), Lease: 5, Batch: &base.Batch{Owner: p.owner, Seq: p.seq,
		Fences: []base.Fence{{Table: p.srcID, Epoch: p.epoch}}, Segments: []base.Segment{oneRow(p.srcID, 65, row64(3))}}})
	require.ErrorIs(t, err, ErrMoved)
	// Thaw (a rollback): writes again.
	p.seq--
	require.NoError(t, p.src.MoveThaw(p.srcID, 5))
	require.NoError(t, p.put(66, 4))
}

// A freeze refused for a transaction in doubt drains the table: its new prepares are refused
// (ErrMoved) for MoveDrainFor, its commits go on, so the next freeze is not refused for new
// transactions (under steady two-phase load it always was: a CI run's move gave up after 458
// refusals). A thaw or the drain's end lets prepares in again.
func TestMoveFreezeRefusedDrainsPrepares(t *testing.T) {
	clock := &fakeClock{}
	p := newMovePairAt(t, clock.Now)
	prepare := func(txn byte, id uint64) error {
		p.seq++
		_, err := p.src.PrepareTxn(&base.TxnPrepare{Txn: txnID(txn), Lease: 5, Batch: &base.Batch{Owner: p.owner, Seq: p.seq,
			Fences: []base.Fence{{Table: p.srcID, Epoch: p.epoch}}, Segments: []base.Segment{oneRow(p.srcID, id, row64(uint64(txn)))}}})
		if err != nil {
			p.seq--
		}
		return err
	}
	require.NoError(t, prepare(1, 64))
	_, err := p.src.MoveFreeze(p.srcID, 5)
	require.ErrorIs(t, err, ErrTxnLocked)
	require.ErrorIs(t, prepare(2, 65), ErrMoved, "draining: a new prepare is refused")
	require.NoError(t, p.put(66, 3), "draining: a commit goes on")
	clock.Advance(MoveDrainFor - time.Millisecond)
	require.ErrorIs(t, prepare(2, 65), ErrMoved, "still draining")
	require.NoError(t, p.src.ApplyTxn(txnID(1), base.DecisionCommit))
	_, err = p.src.MoveFreeze(p.srcID, 5)
	require.NoError(t, err, "nothing in doubt is left: frozen")
	require.NoError(t, p.src.MoveThaw(p.srcID, 5))
	require.NoError(t, prepare(2, 65), "thawed: no drain is left")

	// A drain nobody follows up ends by itself.
	_, err = p.src.MoveFreeze(p.srcID, 6)
	require.ErrorIs(t, err, ErrTxnLocked)
	require.ErrorIs(t, prepare(3, 67), ErrMoved)
	clock.Advance(MoveDrainFor)
	require.NoError(t, prepare(3, 67), "the drain ended")
}

func TestMoveStateRecordDecode(t *testing.T) {
	id, s, epoch, err := decodeMoveStateRecord(appendMoveStateRecord(nil, 7, MoveIncoming, 9))
	require.NoError(t, err)
	require.Equal(t, uint32(7), id)
	require.Equal(t, MoveIncoming, s)
	require.Equal(t, uint64(9), epoch)
	for _, bad := range [][]byte{nil, appendMoveStateRecord(nil, 7, 4, 0), appendMoveStateRecord(nil, 7, MoveRetired, 1), appendMoveStateRecord(nil, 7, MoveLive, 1),
		appendMoveStateRecord(nil, 7, MoveIncoming, 0), make([]byte, 17)} {
		_, _, _, err := decodeMoveStateRecord(bad)
		require.Error(t, err)
	}
}

func FuzzMoveStateRecord(f *testing.F) {
	f.Add(appendMoveStateRecord(nil, 3, MoveFrozen, 0))
	f.Add(appendMoveStateRecord(nil, 3, MoveIncoming, 7))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		id, s, epoch, err := decodeMoveStateRecord(b)
		if err == nil {
			require.Equal(t, b, appendMoveStateRecord(nil, id, s, epoch))
		}
	})
}

func TestMoveErrorsMatchFenced(t *testing.T) {
	require.ErrorIs(t, ErrMoved, ErrFenced)
	require.NotErrorIs(t, ErrFenced, ErrMoved)
}

// A retired source serves nothing: anyone may drop it, though the partitioned table is
// still in the map. An incoming copy may not be dropped while the table is mapped: between
// the switch and its activation it is the partition's only copy the map points at.
func TestMoveCopiesDroppable(t *testing.T) {
	p := newMovePair(t)
	name := base.PartitionTableName("acct", 1)
	require.ErrorIs(t, p.dst.DropTable(name, 99), ErrTableOwned, "a live cluster table of a mapped table")
	require.NoError(t, p.dst.MoveBegin(p.dstID, 3))
	require.ErrorIs(t, p.dst.DropTable(name, 99), ErrTableOwned, "an incoming copy of a mapped table")
	st, _, err := p.dst.MoveStatus(p.dstID)
	require.NoError(t, err)
	require.Equal(t, MoveIncoming, st)
	_, err = p.src.MoveFreeze(p.srcID, 5)
	require.NoError(t, err)
	require.ErrorIs(t, p.src.DropTable(name, 99), ErrTableOwned, "a frozen source is still the partition's copy")
	require.NoError(t, p.src.MoveRetire(p.srcID, 5))
	require.NoError(t, p.src.DropTable(name, 99))
}

// MoveChanges hands out a bounded number of pages per call, each once, until none remain.
func TestMoveChangesBounded(t *testing.T) {
	p := newMovePair(t)
	token, err := p.src.MoveMark(p.srcID)
	require.NoError(t, err)
	want := map[uint64]bool{}
	for i := range 4 { // pages 1, 3, 5, 7
		id := uint64(64 + 128*i)
		require.NoError(t, p.put(id, 1))
		want[id/64] = true
	}
	got := map[uint64]bool{}
	for calls := 0; ; calls++ {
		require.Less(t, calls, 4)
		pages, more, err := p.src.MoveChanges(p.srcID, token, 3, nil)
		require.NoError(t, err)
		require.LessOrEqual(t, len(pages), 3)
		require.True(t, slices.IsSorted(pages))
		for _, pg := range pages {
			require.False(t, got[pg], "page %d handed out twice", pg)
			got[pg] = true
		}
		if !more {
			break
		}
	}
	require.Equal(t, want, got)
}

// The owner id MoveWrite logs under is reserved: a client that claimed it (a session's Hello
// names any id) and committed seq 2^64-1 made the next MoveWrite log seq 0, a commit record
// replay refuses: the storage node could not restart.
func TestMoveWriterOwnerReserved(t *testing.T) {
	p := newMovePair(t)
	ti, err := p.dst.CreateTable("local", 64)
	require.NoError(t, err)
	require.ErrorIs(t, p.dst.Connect(MoveWriter, Incarnation{1}, 1, func() {}), ErrMalformed)
	_, err = p.dst.Acquire(ti.ID, MoveWriter, 0)
	require.ErrorIs(t, err, ErrMalformed)
	_, err = p.dst.CommitWait(&base.Batch{Owner: MoveWriter, Seq: ^uint64(0), Fences: []base.Fence{{Table: ti.ID, Epoch: 1}},
		Segments: []base.Segment{oneRow(ti.ID, 0, row64(1))}})
	require.ErrorIs(t, err, ErrMalformed)
	_, err = p.dst.PrepareTxn(&base.TxnPrepare{Txn: txnID(1), Lease: 5, Batch: &base.Batch{Owner: MoveWriter, Seq: ^uint64(0),
		Fences: []base.Fence{{Table: ti.ID, Epoch: 1}}, Segments: []base.Segment{oneRow(ti.ID, 0, row64(1))}}})
	require.ErrorIs(t, err, ErrMalformed)
	ep := p.v.grant("acct", 1, MoveWriter)
	_, err = p.dst.RegisterGrant(context.Background(), p.dstID, MoveWriter, ep)
	require.ErrorIs(t, err, ErrMalformed)

	// Move writes go on, and survive a restart.
	require.NoError(t, p.dst.MoveBegin(p.dstID, 9))
	_, err = p.dst.MoveWrite([]base.Segment{{Table: p.dstID, Page: 1, Data: 1, Rows: row64(5)}}, 9)
	require.NoError(t, err)
	p.dst.crashForTest()
	p.dst = openTest(t, Options{Dir: p.dstDir, GrantVerifier: p.v, TxnResolveInterval: -1})
	st, _, err := p.dst.MoveStatus(p.dstID)
	require.NoError(t, err)
	require.Equal(t, MoveIncoming, st)
}

// A freeze is its mover's: a mover that adopts a frozen source freezes it again under its
// higher epoch, and the late thaw of the mover that froze it (its rollback, after its move
// record was deleted) is refused and thaws nothing, across a restart and a checkpoint too.
func TestMoveThawOfOlderEpochRefused(t *testing.T) {
	p := newMovePair(t)
	_, err := p.src.MoveFreeze(p.srcID, 0)
	require.ErrorIs(t, err, ErrMalformed)
	_, err = p.src.MoveFreeze(p.srcID, 5)
	require.NoError(t, err)
	_, err = p.src.MoveFreeze(p.srcID, 7) // the successor adopts the frozen source
	require.NoError(t, err)
	_, err = p.src.MoveFreeze(p.srcID, 5)
	require.ErrorIs(t, err, ErrFenced)
	require.NoError(t, p.src.Checkpoint())
	p.src.crashForTest()
	p.src = openTest(t, Options{Dir: p.srcDir, GrantVerifier: p.v, TxnResolveInterval: -1})
	require.ErrorIs(t, p.src.MoveThaw(p.srcID, 5), ErrFenced, "the first mover's late thaw")
	st, _, err := p.src.MoveStatus(p.srcID)
	require.NoError(t, err)
	require.Equal(t, MoveFrozen, st)
	require.ErrorIs(t, p.put(66, 1), ErrMoved, "still frozen")
	require.NoError(t, p.src.MoveThaw(p.srcID, 7))
	require.NoError(t, p.put(66, 1))
}

// A freeze is in force from its record on: a commit or a prepare that takes the engine lock
// while the freeze waits for its record's sync is refused (it was accepted, logged after the
// freeze record, and the prepare left a transaction in doubt on a frozen source: decided
// after the final catch-up, its rows would never reach the copy).
func TestMoveFreezeWindowRefusesCommits(t *testing.T) {
	v := newMemVerifier()
	fs := vfs.NewFaultFS()
	e, err := Open(Options{Dir: "db", FS: fs, Logger: quietLogger, CheckpointInterval: -1, GrantVerifier: v, TxnResolveInterval: -1})
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	ti, err := e.CreateClusterTable(base.PartitionTableName("acct", 1), 64, moveLayout)
	require.NoError(t, err)
	const owner = 11
	epoch := v.grant("acct", 1, owner)
	_, err = e.RegisterGrant(context.Background(), ti.ID, owner, epoch)
	require.NoError(t, err)
	first, _, err := e.AllocIDs(ti.ID, owner, epoch, 1)
	require.NoError(t, err)

	block := newBlockSyncs(fs)
	froze := make(chan error, 1)
	go func() {
		_, err := e.MoveFreeze(ti.ID, 5)
		froze <- err
	}()
	block.waitBlocked(t) // the freeze's record is written, its sync held
	committed := commitAsync(e, batchOf(owner, 1, ti.ID, epoch, oneRow(ti.ID, first, row64(1))))
	prepared := make(chan error, 1)
	go func() {
		_, err := e.PrepareTxn(&base.TxnPrepare{Txn: txnID(1), Lease: 5, Batch: batchOf(owner, 2, ti.ID, epoch, oneRow(ti.ID, first+1, row64(2)))})
		prepared <- err
	}()
	// Each either answers at once (refused) or is applied and waits behind the held sync.
	var errs []error
	var commitDone, prepareDone bool
	deadline := time.Now().Add(idWait)
	for !commitDone || !prepareDone {
		select {
		case err := <-committed:
			errs, commitDone = append(errs, err), true
			continue
		case err := <-prepared:
			errs, prepareDone = append(errs, err), true
			continue
		default:
		}
		e.mu.Lock()
		o := e.owners[owner]
		if o != nil && o.lastSeq >= 1 {
			commitDone = true // applied: it waits for the sync
		}
		if e.tableLocked(ti.ID) {
			prepareDone = true
		}
		e.mu.Unlock()
		require.True(t, time.Now().Before(deadline), "neither refused nor applied")
		runtime.Gosched()
	}
	block.release(false)
	require.NoError(t, waitErr(t, froze, "the freeze"))
	for len(errs) < 2 {
		select {
		case err := <-committed:
			errs = append(errs, err)
		case err := <-prepared:
			errs = append(errs, err)
		case <-time.After(idWait):
			t.Fatal("no answer")
		}
	}
	for _, err := range errs {
		require.ErrorIs(t, err, ErrMoved, "accepted while the freeze's record was being synced")
	}
	require.False(t, e.tableLocked(ti.ID), "no transaction in doubt on a frozen source")
}

// A checkpoint whose snapshot is taken while a freeze waits for its record's sync carries
// the freeze: its checkpoint LSN is past the freeze record, which replay skips. (The state
// was applied only after the sync: the checkpoint carried nothing, and a restart from it
// found the source live.)
func TestMoveFreezeCarriedByCheckpointDuringSync(t *testing.T) {
	v := newMemVerifier()
	fs := vfs.NewFaultFS()
	opts := Options{Dir: "db", FS: fs, Logger: quietLogger, CheckpointInterval: -1, GrantVerifier: v, TxnResolveInterval: -1}
	e, err := Open(opts)
	require.NoError(t, err)
	ti, err := e.CreateClusterTable(base.PartitionTableName("acct", 1), 64, moveLayout)
	require.NoError(t, err)

	block := newBlockSyncs(fs)
	froze := make(chan error, 1)
	go func() {
		_, err := e.MoveFreeze(ti.ID, 5)
		froze <- err
	}()
	block.waitBlocked(t) // the freeze's record is written, its sync held
	ckpt := make(chan error, 1)
	go func() { ckpt <- e.Checkpoint() }()
	deadline := time.Now().Add(idWait)
	for {
		e.mu.Lock()
		snapped := e.walBytesAtCkpt == e.stats.walBytes.Load()
		e.mu.Unlock()
		if snapped {
			break
		}
		require.True(t, time.Now().Before(deadline), "the checkpoint took no snapshot")
		runtime.Gosched()
	}
	block.release(false)
	require.NoError(t, waitErr(t, froze, "the freeze"))
	require.NoError(t, waitErr(t, ckpt, "the checkpoint"))
	e.crashForTest()
	e, err = Open(opts)
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	st, _, err := e.MoveStatus(ti.ID)
	require.NoError(t, err)
	require.Equal(t, MoveFrozen, st, "the freeze survives the checkpoint and the restart")
}

// A mark costs about a bit per page written (a word per 64 pages), not a map entry per page:
// a big hot table's mark stays small. It had an entry per page.
func TestMoveMarkMemoryPerPage(t *testing.T) {
	p := newMovePair(t)
	token, err := p.src.MoveMark(p.srcID)
	require.NoError(t, err)
	const pages = 1 << 14
	p.src.mu.Lock()
	for pg := uint64(1); pg < pages; pg += 2 { // the partition's pages (stripes of one page)
		p.src.moveNoteWrite(&base.Segment{Table: p.srcID, Page: pg})
	}
	entries := len(p.src.moves[p.srcID].dirty)
	p.src.mu.Unlock()
	require.LessOrEqual(t, entries, pages/64, "the mark's entries for %d pages written", pages/2)
	got := map[uint64]bool{}
	for calls := 0; ; calls++ {
		require.Less(t, calls, pages)
		out, more, err := p.src.MoveChanges(p.srcID, token, 1000, nil)
		require.NoError(t, err)
		require.LessOrEqual(t, len(out), 1000)
		require.True(t, slices.IsSorted(out))
		for _, pg := range out {
			require.False(t, got[pg], "page %d handed out twice", pg)
			require.Equal(t, uint64(1), pg%2)
			got[pg] = true
		}
		if !more {
			break
		}
	}
	require.Len(t, got, pages/2)
}
