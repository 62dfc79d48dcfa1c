package txnode

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestViewWaitsDurable: in Durable mode a View of a row whose last commit is not yet durable
// (acknowledgements held back) returns only once it is, whatever fn returned and for a row
// that commit deleted: what fn saw, or the absence, counts only then.
func TestViewWaitsDurable(t *testing.T) {
	ctx := context.Background()
	hs, db, tb, ids := openHeldRows(t, 3)

	s := db.Session()
	ps := []*Pending{
		s.Go(ctx, func(tx *Tx) error { return tx.Put(tb, ids[0], u64Row(64, 5)) }),
		s.Go(ctx, func(tx *Tx) error { return tx.Delete(tb, ids[1]) }),
	}
	waiting := make(chan string, 16)
	db.testHookWait = func(what string) { waiting <- what }
	mine := errors.New("fn's own")
	views := []func() error{
		func() error { return tb.View(ctx, ids[0], func([]byte) error { return nil }) },
		func() error { return tb.View(ctx, ids[0], func([]byte) error { return mine }) },
		func() error { return tb.View(ctx, ids[1], func([]byte) error { return nil }) },
	}
	done := make(chan error, len(views))
	for _, v := range views {
		go func() { done <- v() }()
	}
	for range views {
		require.Equal(t, "durable", recvWithin(t, waiting, "a View waiting for durability"))
	}
	select {
	case err := <-done:
		t.Fatalf("a View returned (%v) before the commit it saw was durable", err)
	default:
	}
	hs.release()
	var errs []error
	for range views {
		errs = append(errs, recvWithin(t, done, "a View after the release"))
	}
	require.ElementsMatch(t, []error{nil, mine, ErrNotFound}, errs)
	for _, p := range ps {
		require.NoError(t, p.Wait(ctx))
	}
}

// TestGetOfDeletedRowWaitsDurable: in Durable mode a Get of a row whose deletion is not yet
// durable returns ErrNotFound only once the deletion is: a crash before then would bring the
// row back, and the reader would have acted on an absence that never happened. Both paths:
// the lock-free hit, and the slow path a Get takes when the hit's checks fail (called
// directly here). Fails on 583fb27 (path=slow): getSlow returned ErrNotFound at once for a
// Get (a View waited).
func TestGetOfDeletedRowWaitsDurable(t *testing.T) {
	ctx := context.Background()
	hs, db, tb, ids := openHeldRows(t, 2)
	defer hs.release() // before Close, which waits for the held deletion, on a failure

	p := db.Session().Go(ctx, func(tx *Tx) error { return tx.Delete(tb, ids[1]) })
	waiting := make(chan string, 4)
	db.testHookWait = func(what string) { waiting <- what }
	gets := map[string]func() error{
		"fast": func() error { return tb.Get(ctx, ids[1], make([]byte, 64)) },
		"slow": func() error { return tb.getSlow(ctx, ids[1], copyRow(make([]byte, 64))) },
	}
	done := make(chan error, len(gets))
	for path, get := range gets {
		go func() { done <- get() }()
		require.Equal(t, "durable", recvWithin(t, waiting, "the "+path+" Get waiting for durability"))
	}
	select {
	case err := <-done:
		t.Fatalf("a Get returned (%v) before the deletion it saw was durable", err)
	default:
	}
	hs.release()
	for range gets {
		require.ErrorIs(t, recvWithin(t, done, "a Get after the release"), ErrNotFound)
	}
	require.NoError(t, p.Wait(ctx))
}

// openHeldRows opens a DB over a heldCommitStore, creates table "h" (64-byte rows) with n
// rows committed durably, then holds back the acknowledgements of later commits. The DB
// closes in the test's cleanup, after its defers (a deferred release comes first).
func openHeldRows(t *testing.T, n int) (*heldCommitStore, *DB, *Table, []uint64) {
	t.Helper()
	ctx := context.Background()
	hs := &heldCommitStore{Store: newLocalStore(t, ""), released: true}
	db := openDB(t, ctx, Options{Store: hs})
	t.Cleanup(func() { db.Close(ctx) })
	tb, ids := newTableRows(t, ctx, db, "h", n)
	hs.mu.Lock()
	hs.released = false
	hs.mu.Unlock()
	return hs, db, tb, ids
}
