package txnode

import (
	"context"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/txnode/store"
)

// TestTablePinEndedWhileFetchingLastPage: an Unpin or a DropTable while a Pin fetches the
// table's last page ends that Pin: it fails (Unpin's contract: a Pin in flight fails), and
// nothing is left pinned. The Pin used to return nil with no pin held.
func TestTablePinEndedWhileFetchingLastPage(t *testing.T) {
	boolSubtests(t, "unpin", "drop", func(t *testing.T, drop bool) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		dir := t.TempDir()
		db := openDB(t, ctx, Options{Dir: dir, SyncMode: "none"})
		tb := newTable(t, ctx, db, "t", 64)
		fillTable(t, ctx, db, tb, 1, 0) // one page: the Pin's last
		require.NoError(t, db.Close(ctx))

		held := newHeldReadStore(newLocalStore(t, dir))
		db = openDB(t, ctx, Options{Store: held})
		defer db.Close(ctx)
		tb = openTable(t, ctx, db, "t")

		held.armed.Store(true)
		res := make(chan error, 1)
		go func() { res <- tb.Pin(ctx) }()
		recvWithin(t, held.entered, "the Pin's fetch")
		if drop {
			require.NoError(t, db.DropTable(ctx, "t"))
		} else {
			tb.Unpin()
		}
		close(held.release)
		err := recvWithin(t, res, "the Pin")
		require.Error(t, err, "a Pin ended while in flight")
		if drop {
			require.ErrorIs(t, err, ErrTableNotFound)
		}
		require.False(t, tb.Stats().Pinned)
		require.Zero(t, db.Stats().PinnedBytes)
		require.NoError(t, db.cache.verify())
	})
}

// ctxHeldStore holds one armed Read until release or the end of the Read's context (which
// it returns then).
type ctxHeldStore struct {
	store.Store
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (s *ctxHeldStore) Read(ctx context.Context, reqs []base.PageWant, fill func(int, uint64, uint64, []byte)) error {
	if s.armed.CompareAndSwap(true, false) {
		close(s.entered)
		select {
		case <-s.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return s.Store.Read(ctx, reqs, fill)
}

// waitPinWaiting returns once a goroutine waits in Table.Pin for another's Pin in flight.
func waitPinWaiting(t *testing.T) {
	t.Helper()
	buf := make([]byte, 1<<20)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		n := runtime.Stack(buf, true)
		for _, g := range strings.Split(string(buf[:n]), "\n\n") {
			lines := strings.SplitN(g, "\n", 3)
			if len(lines) >= 2 && strings.Contains(lines[0], "[select") && strings.Contains(lines[1], "txnode.(*Table).Pin(") {
				return
			}
		}
		runtime.Gosched()
	}
	t.Fatal("no Pin waits for the one in flight")
}

// TestTablePinWaiterOutlivesFailedPin: a Pin that waits for another's Pin in flight is not
// failed by that one's end (its context ended): it pins the table itself, within its own
// context. It used to return the other caller's context.Canceled, its own context live.
func TestTablePinWaiterOutlivesFailedPin(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dir := t.TempDir()
	db := openDB(t, ctx, Options{Dir: dir, SyncMode: "none"})
	tb := newTable(t, ctx, db, "t", 64)
	fillTable(t, ctx, db, tb, 2, 0)
	require.NoError(t, db.Close(ctx))

	held := &ctxHeldStore{Store: newLocalStore(t, dir), entered: make(chan struct{}), release: make(chan struct{})}
	db = openDB(t, ctx, Options{Store: held})
	defer db.Close(ctx)
	tb = openTable(t, ctx, db, "t")

	held.armed.Store(true)
	actx, acancel := context.WithCancel(ctx)
	first := make(chan error, 1)
	go func() { first <- tb.Pin(actx) }()
	recvWithin(t, held.entered, "the first Pin's fetch")
	second := make(chan error, 1)
	go func() { second <- tb.Pin(ctx) }()
	waitPinWaiting(t)
	acancel()
	require.ErrorIs(t, recvWithin(t, first, "the first Pin"), context.Canceled)
	require.NoError(t, recvWithin(t, second, "the second Pin"))
	st := tb.Stats()
	require.True(t, st.Pinned)
	require.GreaterOrEqual(t, st.PinnedPages, 2)
	require.NoError(t, db.cache.verify())
}
