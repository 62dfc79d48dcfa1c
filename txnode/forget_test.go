package txnode

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/txnode/store"
)

// acctTable creates in db the cluster table "acct" of one partition (64-byte rows, one
// stripe page), failing the test on error; it returns it and its partition's table name.
func acctTable(t testing.TB, ctx context.Context, db *DB) (*Table, string) {
	t.Helper()
	tb, err := db.createClusterTable(ctx, "acct", 64, base.ClusterLayout{Partitions: 1, StripePages: 1})
	require.NoError(t, err)
	return tb, base.PartitionTableName("acct", 0)
}

// Forget (txncoord.Forget) gives one table's state up and nothing at the store: every acknowledged
// commit is durable first (in WriteBack, with a flush period that never comes, only the
// forget's flush writes them), the grant is released, the old handle, its pin and a
// transaction that touched it fail with ErrForgotten, and the next open takes a new grant,
// reads the rows afresh and writes on. The old handle's Unpin leaves the new state's pin.
func TestForgetTableOpensAfresh(t *testing.T) {
	for _, mode := range []Durability{Durable, WriteBack} {
		t.Run(fmt.Sprint(mode), func(t *testing.T) {
			ctx := context.Background()
			const owner = 0x42
			g, st := grantStore(t, owner)
			db := openDB(t, ctx, Options{Store: st, OwnerID: owner, grants: g, Durability: mode, FlushInterval: time.Hour})
			defer db.Close(ctx)
			tb, name := acctTable(t, ctx, db)
			var ids []uint64
			for i := range 10 {
				ids = append(ids, insertRow(t, ctx, tb, row(uint64(i))))
			}
			require.NoError(t, tb.Put(ctx, ids[0], row(100)))
			require.NoError(t, tb.Pin(ctx))
			require.True(t, tb.Stats().Pinned)
			dst := make([]byte, 64)
			tx := openTx(t, ctx, db, true)
			require.NoError(t, tx.Get(tb, ids[1], dst))
			require.NoError(t, tx.Put(tb, ids[1], row(7)))

			require.NoError(t, tb.forget(ctx))
			require.EqualValues(t, 1, g.releases.Load(), "the forgotten table's grant is released")
			g.mu.Lock()
			_, held := g.keys["acct/0"]
			g.mu.Unlock()
			require.False(t, held, "the owner key is gone")
			info, err := db.openDurable(ctx, name)
			require.NoError(t, err)
			d := &durableTable{DB: db, Info: info}
			require.NoError(t, d.get(ctx, ids[0], dst))
			require.Equal(t, row(100), dst, "the last acknowledged write is durable at the store")

			for _, err := range []error{tb.Get(ctx, ids[0], dst), tb.Put(ctx, ids[0], row(1)), tx.Commit()} {
				require.ErrorIs(t, err, ErrForgotten)
				require.ErrorIs(t, err, ErrLeaseExpired)
			}
			_, err = tb.Insert(ctx, row(1))
			require.ErrorIs(t, err, ErrForgotten)
			require.ErrorIs(t, tb.Pin(ctx), ErrForgotten)
			require.False(t, tb.Stats().Pinned, "the pin went with the state")
			require.NoError(t, tb.forget(ctx), "forgetting a forgotten state is a no-op")
			require.NoError(t, db.forgetTable(ctx, name), "and so is a table not open")
			require.EqualValues(t, 1, g.releases.Load())

			misses := db.Stats().PageMisses
			tb2 := openTable(t, ctx, db, name)
			require.EqualValues(t, 2, g.calls.Load(), "a grant taken anew")
			require.NoError(t, tb2.Get(ctx, ids[0], dst))
			require.Equal(t, row(100), dst)
			require.NoError(t, tb2.Get(ctx, ids[1], dst))
			require.Equal(t, row(1), dst, "the forgotten transaction wrote nothing")
			require.Greater(t, db.Stats().PageMisses, misses, "read afresh from the store, not from the old frames")
			require.NoError(t, tb2.Pin(ctx))
			tb.Unpin()
			require.True(t, tb2.Stats().Pinned, "the old handle's Unpin leaves the new state's pin")
			require.NoError(t, tb2.Put(ctx, ids[0], row(200)))
			require.NoError(t, tb2.Get(ctx, ids[0], dst))
			require.Equal(t, row(200), dst)
			require.NoError(t, db.Flush(ctx))
			require.NoError(t, d.get(ctx, ids[0], dst))
			require.Equal(t, row(200), dst)
		})
	}
}

// forgottenAcct opens a DB of owner 0x42 (its grants g) through a heldReadStore, not armed,
// whose table "acct" (acctTable) got row x, row(1), and was then forgotten. The caller
// closes the DB.
func forgottenAcct(t *testing.T, ctx context.Context) (db *DB, g *memGrants, hs *heldReadStore, tb *Table, name string, x uint64) {
	t.Helper()
	const owner = 0x42
	g, st := grantStore(t, owner)
	hs = newHeldReadStore(st)
	db = openDB(t, ctx, Options{Store: hs, OwnerID: owner, grants: g})
	tb, name = acctTable(t, ctx, db)
	x = insertRow(t, ctx, tb, row(1))
	require.NoError(t, tb.forget(ctx))
	return db, g, hs, tb, name, x
}

// A reader of the forgotten state whose fetch was in flight across the forget, a re-open and
// a write through the new state fills a frame nobody serves any more: the new state reads
// its own write, never the older rows the held fetch brought. Readers racing forgets and
// re-opens get the row's current value or ErrForgotten, nothing else (run with -race: no
// read of a freed frame).
func TestForgetTableConcurrentReader(t *testing.T) {
	ctx := context.Background()
	db, g, hs, _, name, x := forgottenAcct(t, ctx)
	defer db.Close(ctx)

	// The held fetch: a miss of the re-opened state, its answer (row 1) held back.
	tb2 := openTable(t, ctx, db, name)
	hs.armed.Store(true)
	got := make(chan error, 1)
	held := make([]byte, 64)
	go func() { got <- tb2.Get(ctx, x, held) }()
	recvWithin(t, hs.entered, "the held fetch")
	require.NoError(t, tb2.forget(ctx))
	tb3 := openTable(t, ctx, db, name)
	require.NoError(t, tb3.Put(ctx, x, row(2)))
	close(hs.release)
	if err := recvWithin(t, got, "the held Get"); err == nil {
		require.Equal(t, row(1), held, "the held Get returns what it read before the forget")
	} else {
		require.ErrorIs(t, err, ErrForgotten)
	}
	dst := make([]byte, 64)
	require.NoError(t, tb3.Get(ctx, x, dst))
	require.Equal(t, row(2), dst, "the new state's own write, not the held fetch's older row")

	// Readers racing forgets, re-opens and writes.
	var cur atomic.Pointer[Table]
	cur.Store(tb3)
	var ver atomic.Uint64 // the value last written: a reader sees it or a later one
	ver.Store(2)
	stop := make(chan struct{})
	errs := make(chan error, 4)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := make([]byte, 64)
			for {
				select {
				case <-stop:
					errs <- nil
					return
				default:
				}
				floor := ver.Load()
				err := cur.Load().Get(ctx, x, b)
				if errors.Is(err, ErrForgotten) {
					continue
				}
				if err != nil {
					errs <- fmt.Errorf("a reader: %w", err)
					return
				}
				v := binaryRow(b)
				if v < floor || string(b) != string(row(v)) {
					errs <- fmt.Errorf("a reader read %d (row %x), the last write before its read was %d", v, b[:8], floor)
					return
				}
			}
		}()
	}
	for i := range 30 {
		require.NoError(t, cur.Load().forget(ctx))
		next := openTable(t, ctx, db, name)
		v := uint64(3 + i)
		require.NoError(t, next.Put(ctx, x, row(v)))
		ver.Store(v)
		cur.Store(next)
	}
	close(stop)
	wg.Wait()
	for range 4 {
		require.NoError(t, <-errs)
	}
	require.EqualValues(t, 33, g.calls.Load(), "one grant per open")
}

// binaryRow is the value row(v) encodes.
func binaryRow(b []byte) uint64 {
	var v uint64
	for i := 7; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v
}

// Forget against a concurrent DropTable, Pin and flush (a hostile review of forget.go): each
// test is named after the defect it showed, fixed since.

// forgetGateStore holds the first commit batch after it is armed inside Commit until gate is
// closed: the pipeline's goroutine that sends it (WriteBack: the flusher, which cuts the
// epochs) waits there, taking no other request meanwhile.
type forgetGateStore struct {
	store.Store
	armed   atomic.Bool
	entered chan struct{}
	gate    chan struct{}
}

func newForgetGateStore(s store.Store) *forgetGateStore {
	return &forgetGateStore{Store: s, entered: make(chan struct{}), gate: make(chan struct{})}
}

func (s *forgetGateStore) Commit(b *base.Batch, done func(uint64, error)) {
	if s.armed.CompareAndSwap(true, false) {
		close(s.entered)
		<-s.gate
	}
	s.Store.Commit(b, done)
}

// gatedAcct opens a WriteBack DB (a flush period that never comes) of owner 0x42 through a
// forgetGateStore, not armed, whose table "acct" (acctTable) holds row x: row(1) flushed,
// then row(2) acknowledged in the cache only. The caller closes the DB.
func gatedAcct(t *testing.T, ctx context.Context) (db *DB, gs *forgetGateStore, tb *Table, name string, x uint64) {
	t.Helper()
	const owner = 0x42
	g, st := grantStore(t, owner)
	gs = newForgetGateStore(st)
	db = openDB(t, ctx, Options{Store: gs, OwnerID: owner, grants: g, Durability: WriteBack, FlushInterval: time.Hour})
	tb, name = acctTable(t, ctx, db)
	x = insertRow(t, ctx, tb, row(1))
	require.NoError(t, db.Flush(ctx))
	require.NoError(t, tb.Put(ctx, x, row(2)))
	return db, gs, tb, name, x
}

// A DropTable that fails while a Forget of the same table flushes reopens the table to
// commits under the forget (closeTable(t, false): Forget's one-at-a-time semaphore covers
// other forgets only), so in WriteBack a commit admitted then is acknowledged, and the
// forget, whose flush was cut before it, drops its dirty frame unwritten: an acknowledged
// write lost. Should: the Put fail (ErrForgotten: the table is being forgotten) or, if
// acknowledged, be durable once the forget returns. Does: the Put is acknowledged and the
// re-opened table reads the row before it.
func TestForgetReopenedByFailedDropTableLosesAckedWrite(t *testing.T) {
	ctx := context.Background()
	db, gs, tb, name, x := gatedAcct(t, ctx)
	defer db.Close(ctx)
	gs.armed.Store(true)
	forgot := make(chan error, 1)
	go func() { forgot <- tb.forget(ctx) }()
	recvWithin(t, gs.entered, "the forget's flush at the store")

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	require.Error(t, db.DropTable(cctx, name), "a DropTable whose flush cannot finish")
	perr := tb.Put(ctx, x, row(3))
	close(gs.gate)
	require.NoError(t, recvWithin(t, forgot, "the forget"))

	tb2 := openTable(t, ctx, db, name)
	dst := make([]byte, 64)
	require.NoError(t, tb2.Get(ctx, x, dst))
	if perr == nil {
		require.Equal(t, row(3), dst, "the Put acknowledged during the forget is lost")
	} else {
		require.ErrorIs(t, perr, ErrForgotten)
		require.Equal(t, row(2), dst)
	}
}

// A Pin in flight across a Forget of its table (its page fetch held at the store while the
// state is forgotten) fails with ErrTableNotFound ("was dropped": pinEndedLocked tells a
// forgotten state from a dropped one by nothing), not with ErrForgotten, which Forget's
// contract gives every call of the forgotten state's handles and which cluster/node counts
// as a lost grant (its Pin passes any other error to the game as is, the partition still
// listed as owned). Should: errors.Is(err, ErrForgotten). Does: ErrTableNotFound only.
func TestPinInFlightAcrossForgetNotErrForgotten(t *testing.T) {
	ctx := context.Background()
	db, _, hs, tb, _, _ := forgottenAcct(t, ctx)
	defer db.Close(ctx)
	tb = openTable(t, ctx, db, base.PartitionTableName("acct", 0)) // its page not cached

	hs.armed.Store(true)
	pinned := make(chan error, 1)
	go func() { pinned <- tb.Pin(ctx) }()
	recvWithin(t, hs.entered, "the Pin's fetch at the store")
	require.NoError(t, tb.forget(ctx))
	close(hs.release)
	err := recvWithin(t, pinned, "the Pin")
	require.Error(t, err)
	require.ErrorIs(t, err, ErrForgotten, "the Pin of a forgotten state: %v", err)
}

// The other way round: a Forget that fails (its ctx ends during its flush) while a DropTable
// of the same table flushes reopens the table to commits under the drop, so a commit
// admitted then is acknowledged (WriteBack) although DropTable closed the table to commits
// ("they fail with ErrTableNotFound") and drops it with its unwritten frame.
// Should: the Put fail with ErrTableNotFound. Does: it is acknowledged.
func TestFailedForgetReopensTableBeingDropped(t *testing.T) {
	ctx := context.Background()
	db, gs, tb, name, x := gatedAcct(t, ctx)
	defer db.Close(ctx)
	gs.armed.Store(true)
	dropped := make(chan error, 1)
	go func() { dropped <- db.DropTable(ctx, name) }()
	recvWithin(t, gs.entered, "the drop's flush at the store")
	// The flusher waits in the store: the forget's flush cannot even cut, and gives up
	// when its ctx ends.
	fctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	require.Error(t, tb.forget(fctx), "a Forget whose flush cannot finish")
	cancel()
	perr := tb.Put(ctx, x, row(3))
	close(gs.gate)
	require.NoError(t, recvWithin(t, dropped, "the drop"))
	require.ErrorIs(t, perr, ErrTableNotFound, "a write of a table being dropped")
}
