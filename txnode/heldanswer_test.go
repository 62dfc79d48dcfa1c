package txnode

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/storenode"
)

// answerStore sends every commit batch to the store but, once armed, holds back each
// answer: the test delivers them (deliver), in any order, optionally replacing the store's
// answer with another error (a connection lost).
type answerStore struct {
	*holdStore
	armed   atomic.Bool
	answers chan heldAnswer
	taken   func(heldAnswer) // records an answer next handed out
}

type heldAnswer struct {
	seq  uint64
	lsn  uint64
	err  error
	done func(uint64, error)
	once *sync.Once // a test that failed midway delivers the rest at cleanup
}

func (f *answerStore) Commit(b *base.Batch, done func(lsn uint64, err error)) {
	if !f.armed.Load() {
		f.Store.Commit(b, done)
		return
	}
	seq := b.Seq
	f.Store.Commit(b, func(lsn uint64, err error) { f.answers <- heldAnswer{seq, lsn, err, done, new(sync.Once)} })
}

// next returns the next held answer.
func (f *answerStore) next(t *testing.T, ctx context.Context) heldAnswer {
	t.Helper()
	select {
	case a := <-f.answers:
		f.taken(a)
		return a
	case <-ctx.Done():
		t.Fatal("no commit batch reached the store")
		return heldAnswer{}
	}
}

func (a heldAnswer) deliver()             { a.once.Do(func() { a.done(a.lsn, a.err) }) }
func (a heldAnswer) deliverErr(err error) { a.once.Do(func() { a.done(0, err) }) }

// newAnswerRig is a fenceRig over an answerStore, and the test's context: 30 s, cancelled
// when the test ends. At cleanup (after that cancel, before the DB's Close) every answer
// still held is delivered, so a test that failed midway does not leave Close waiting.
func newAnswerRig(t *testing.T) (context.Context, *fenceRig, *answerStore) {
	fs := &answerStore{holdStore: &holdStore{held: make(chan func(), 4)}, answers: make(chan heldAnswer, 16)}
	r := newHoldRig(t, fs.holdStore, fs)
	var mu sync.Mutex
	var taken []heldAnswer
	fs.taken = func(a heldAnswer) {
		mu.Lock()
		taken = append(taken, a)
		mu.Unlock()
	}
	t.Cleanup(func() {
		fs.armed.Store(false)
		mu.Lock()
		defer mu.Unlock()
		for _, a := range taken {
			a.deliver()
		}
		for {
			select {
			case a := <-fs.answers:
				a.deliver()
			default:
				return
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx, r, fs
}

// refuseWrite fences acct and arms f, then runs write (a write of acct) in the background:
// the store refuses its batch. It returns the refusal's held answer and write's error.
func (f *answerStore) refuseWrite(t *testing.T, ctx context.Context, r *fenceRig, write func() error) (heldAnswer, <-chan error) {
	t.Helper()
	r.fenceAcct()
	f.armed.Store(true)
	putErr := make(chan error, 1)
	go func() { putErr <- write() }()
	return f.next(t, ctx), putErr
}

// putTx writes v to row id of tbl in a transaction of its own, committed.
func putTx(ctx context.Context, db *DB, tbl *Table, id uint64, v []byte) error {
	tx, err := db.Begin(ctx, true)
	if err == nil {
		err = tx.Put(tbl, id, v)
	}
	if err == nil {
		err = tx.Commit()
	}
	return err
}

// commitAsync writes v to row id of tbl in a transaction of its own and commits it in the
// background, returning the commit's error.
func commitAsync(t *testing.T, ctx context.Context, db *DB, tbl *Table, id uint64, v []byte) <-chan error {
	t.Helper()
	ch := make(chan error, 1)
	tx, err := db.Begin(ctx, true)
	require.NoError(t, err)
	require.NoError(t, tx.Put(tbl, id, v))
	go func() { ch <- tx.Commit() }()
	return ch
}

// waitNoRecovery waits until no recovery is in progress (endRecoveryLocked broadcasts room).
func waitNoRecovery(ctx context.Context, p *pipeline) {
	stop := context.AfterFunc(ctx, func() {
		p.mu.Lock()
		p.room.Broadcast()
		p.mu.Unlock()
	})
	defer stop()
	p.mu.Lock()
	for p.rec != nil && ctx.Err() == nil {
		p.room.Wait()
	}
	p.mu.Unlock()
}

// A two-phase commit's part applied while a held batch (in flight after a refused one) is
// the last in flight joins that batch (installApplied extends its lastVer): the held batch's
// committers must still be answered when it comes back (on e630a9e releaseHeld looked the
// hold up by firstVer and the extended lastVer, found none, and the committer waited for
// ever: a wait that never ends).
func TestHeldBatchJoinedByAppliedPartAnswered(t *testing.T) {
	ctx, r, fs := newAnswerRig(t)
	a := insertRow(t, ctx, r.acct, row(1))
	g1 := insertRow(t, ctx, r.gold, row(1))
	g2 := insertRow(t, ctx, r.gold, row(1))
	g3 := insertRow(t, ctx, r.gold, row(1))

	// A prepared part on g3, applied later.
	ptx, err := r.db.Begin(ctx, true)
	require.NoError(t, err)
	require.NoError(t, ptx.Put(r.gold, g3, row(9)))
	txid := [16]byte{9, 9}
	prep, err := ptx.prepare(txnInfo{ID: txid, Lease: 1})
	require.NoError(t, err)
	require.NoError(t, r.db.decideTxn(ctx, txid, 1, base.DecisionCommit, 1))

	// batch r: refused (fenced), held
	refusal, putErr := fs.refuseWrite(t, ctx, r, func() error { return putTx(ctx, r.db, r.acct, a, row(2)) })
	xErr := commitAsync(t, ctx, r.db, r.gold, g1, row(5))
	x := fs.next(t, ctx) // batch x (ErrSeqGap at the store), held
	yErr := commitAsync(t, ctx, r.db, r.gold, g2, row(6))
	y := fs.next(t, ctx) // batch y, held
	require.Less(t, refusal.seq, x.seq)
	require.Less(t, x.seq, y.seq)

	refusal.deliver() // the recovery starts; x and y are held
	y.deliverErr(fmt.Errorf("%w: connection lost", ErrUnknownOutcome))
	waitNoRecovery(ctx, r.db.pipe) // the pipeline failed for good: the recovery ended
	require.ErrorIs(t, r.db.pipe.failure(), ErrUnknownOutcome)

	// The applied part joins the last batch in flight: y.
	require.NoError(t, prep.apply(ctx, base.DecisionCommit))
	x.deliver() // x retires, then y

	for _, c := range []struct {
		name string
		ch   <-chan error
		want error
	}{{"x", xErr, ErrConflict}, {"y", yErr, ErrUnknownOutcome}} {
		select {
		case err := <-c.ch:
			require.ErrorIs(t, err, c.want, c.name)
		case <-ctx.Done():
			t.Fatalf("the committer of held batch %s was never answered", c.name)
		}
	}
	require.Error(t, <-putErr)
}

// A held batch Close gives up on (abandonLocked) has an unknown outcome: its committers get
// an error wrapping ErrUnknownOutcome, whatever failed the pipeline before (on e630a9e they
// got the pipeline's failure, here a later batch's ErrClosed: "nothing applied", for a batch
// a storage node that forgot the refusal may still apply).
func TestHeldBatchAbandonedUnknown(t *testing.T) {
	ctx, r, fs := newAnswerRig(t)
	a := insertRow(t, ctx, r.acct, row(1))
	g1 := insertRow(t, ctx, r.gold, row(1))
	g2 := insertRow(t, ctx, r.gold, row(1))

	refusal, putErr := fs.refuseWrite(t, ctx, r, func() error { return putTx(ctx, r.db, r.acct, a, row(2)) })
	xErr := commitAsync(t, ctx, r.db, r.gold, g1, row(5))
	fs.next(t, ctx) // x: never answered
	commitAsync(t, ctx, r.db, r.gold, g2, row(6))
	y := fs.next(t, ctx)

	refusal.deliver() // the recovery starts; x and y are held
	y.deliverErr(fmt.Errorf("txnode test: %w", ErrClosed))
	ended, cancelEnded := context.WithCancel(ctx)
	cancelEnded()
	_ = r.db.Close(ended) // gives up on x (its error: the pipeline's, here ErrClosed)
	select {
	case err := <-xErr:
		require.ErrorIs(t, err, ErrUnknownOutcome, "x was never answered")
		require.NotErrorIs(t, err, ErrClosed)
	case <-ctx.Done():
		t.Fatal("the committer of the abandoned held batch was never answered")
	}
	require.Error(t, <-putErr)
}

// A batch refused while Close is in progress fails the pipeline for good (refusedLocked
// does not recover when closing), but the committers of the batches in flight after it
// are answered by their own batch, as the held ones are during a recovery (on e630a9e they
// were answered at once with the pipeline's failure, the refused batch's error: here
// ErrTableNotFound, documented as "nothing applied", though a storage node that forgot the
// refusal may still apply them: here it acknowledges x).
// Remembered (the store refuses x too), x's committer gets the pipeline's failure.
func TestRefusalDuringCloseLaterBatchAnswer(t *testing.T) {
	t.Run("forget", func(t *testing.T) { refusalDuringClose(t, true) })
	t.Run("remember", func(t *testing.T) { refusalDuringClose(t, false) })
}

func refusalDuringClose(t *testing.T, forget bool) {
	ctx, r, fs := newAnswerRig(t)
	closing := make(chan struct{}, 1)
	var watch atomic.Bool
	r.db.testHookWait = func(what string) {
		if what == "durable" && watch.Load() {
			select {
			case closing <- struct{}{}:
			default:
			}
		}
	}
	a := insertRow(t, ctx, r.acct, row(1))
	g1 := insertRow(t, ctx, r.gold, row(1))

	refusal, putErr := fs.refuseWrite(t, ctx, r, func() error { return r.acct.Put(ctx, a, row(2)) })
	xErr := commitAsync(t, ctx, r.db, r.gold, g1, row(5))
	x := fs.next(t, ctx)

	watch.Store(true)
	closeErr := make(chan error, 1)
	go func() { closeErr <- r.db.Close(ctx) }()
	<-closing // Close's flush waits: closing is set
	refusal.deliverErr(fmt.Errorf("%w: table \"acct.p0\" was dropped", storenode.ErrTableNotFound))
	if forget {
		x.done(x.lsn+1, nil) // a store that forgot the refusal applies x
	} else {
		x.deliver() // ErrSeqGap: not applied
	}
	select {
	case err := <-xErr:
		if forget {
			require.NoError(t, err, "x was applied")
		} else {
			require.ErrorIs(t, err, ErrTableNotFound, "x was refused: the pipeline's failure")
		}
	case <-ctx.Done():
		t.Fatal("x's committer was never answered")
	}
	<-closeErr
	<-putErr
}
