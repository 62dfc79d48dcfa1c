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
)

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
			tb, err := db.createClusterTable(ctx, "acct", 64, base.ClusterLayout{Partitions: 1, StripePages: 1})
			require.NoError(t, err)
			name := base.PartitionTableName("acct", 0)
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

// A reader of the forgotten state whose fetch was in flight across the forget, a re-open and
// a write through the new state fills a frame nobody serves any more: the new state reads
// its own write, never the older rows the held fetch brought. Readers racing forgets and
// re-opens get the row's current value or ErrForgotten, nothing else (run with -race: no
// read of a freed frame).
func TestForgetTableConcurrentReader(t *testing.T) {
	ctx := context.Background()
	const owner = 0x42
	g, st := grantStore(t, owner)
	hs := newHeldReadStore(st)
	db := openDB(t, ctx, Options{Store: hs, OwnerID: owner, grants: g})
	defer db.Close(ctx)
	tb, err := db.createClusterTable(ctx, "acct", 64, base.ClusterLayout{Partitions: 1, StripePages: 1})
	require.NoError(t, err)
	name := base.PartitionTableName("acct", 0)
	x := insertRow(t, ctx, tb, row(1))
	require.NoError(t, tb.forget(ctx))

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
