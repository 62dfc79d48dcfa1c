package txnode

import (
	"context"
	"encoding/binary"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/storenode/server"
	"github.com/weftdb/weft/txnode/store"
)

// Owner identity and retries through the public API over TCP: Release on Close, two live
// nodes with one owner id, and a connection dropped on the client side only.

// requireEachAppliedOnce checks that every counter of ids in tb is per (each increment of
// each writer, its what, acknowledged once is there once), then closes db (of owner owner)
// and checks that srv applied each of its batches once: its applied commits are the seqs 1..n.
func requireEachAppliedOnce(t *testing.T, ctx context.Context, srv *server.Server, db *DB, tb *Table, ids []uint64, per int, owner uint64, what string) {
	t.Helper()
	got := make([]byte, 64)
	for w, id := range ids {
		require.NoError(t, tb.Get(ctx, id, got))
		require.Equal(t, uint64(per), binary.LittleEndian.Uint64(got), "%s %d", what, w)
	}
	require.NoError(t, db.Close(ctx))
	st := srv.Engine().Stats()
	g, err := srv.Engine().Acquire(tb.t.id, owner, 0)
	require.NoError(t, err)
	require.Equal(t, g.LastSeq, st.Commits, "every seq applied exactly once")
}

// startIdentityNode runs a storage node and returns its address and server.
func startIdentityNode(t *testing.T, opts storenode.Options) (string, *server.Server) {
	t.Helper()
	srv, err := server.New(server.Config{Listen: "127.0.0.1:0", Options: opts})
	require.NoError(t, err)
	require.NoError(t, srv.Start())
	t.Cleanup(func() { require.NoError(t, srv.Shutdown(context.Background())) })
	return srv.Addr().String(), srv
}

// Close releases the node's tables: another node (another owner id) takes them at once, and
// so does the next run of the same program. Fails on 767c454, where the second node got
// ErrTableOwned for the rest of the 10 s lease.
func TestCloseReleasesTables(t *testing.T) {
	ctx := context.Background()
	addr, _ := startIdentityNode(t, storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone})
	for run := range 3 {
		db, err := Open(ctx, Options{StoreAddr: addr}) // a random owner id per run
		require.NoError(t, err)
		var tb *Table
		if run == 0 {
			tb, err = db.CreateTable(ctx, "loot", 64)
		} else {
			tb, err = db.Table(ctx, "loot")
		}
		require.NoError(t, err, "run %d", run)
		insertRow(t, ctx, tb, row(uint64(run)))
		n := 0
		for _, err := range tb.Scan(ctx, 0, ^uint64(0)) {
			require.NoError(t, err)
			n++
		}
		require.Equal(t, run+1, n, "every run's row is there")
		require.NoError(t, db.Close(ctx))
	}
}

// Two live nodes with one owner id (a copied config, a rolling deploy): the second is refused
// with ErrOwnerInUse while the first lives, under a mixed write load; it gets in once the
// first closes, and no write the first had acknowledged is lost.
func TestTwoLiveNodesOneOwnerID(t *testing.T) {
	ctx := context.Background()
	addr, srv := startIdentityNode(t, storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone})
	const owner = 0x5151
	a := openDB(t, ctx, Options{StoreAddr: addr, OwnerID: owner})
	ta := newTable(t, ctx, a, "acct", 64)

	writers, per := 8, 200
	if testing.Short() {
		writers, per = 4, 60
	}
	type acked struct {
		id, v uint64
	}
	var mu sync.Mutex
	var done []acked
	var deleted []uint64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				v := uint64(w)<<32 | uint64(i) + 1
				id, err := ta.Insert(ctx, row(v))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				k := len(done)
				done = append(done, acked{id, v})
				mu.Unlock()
				if i%5 == 4 { // updates and deletes too
					err = a.Update(ctx, func(tx *Tx) error { return tx.Put(ta, id, row(v+1000)) })
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					done[k].v = v + 1000
					mu.Unlock()
				}
				if i%7 == 6 {
					if err := ta.Delete(ctx, id); err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					deleted = append(deleted, id)
					mu.Unlock()
				}
				if i == per/2 && w == 0 {
					close(stop)
				}
			}
		}()
	}
	<-stop
	// B, with A's owner id, while A writes: refused, never let in to take A's tables. It says
	// once what it waits for (fails on db90132: it waited in silence; issue 23 item 5).
	const waitLine = "the owner id is in use at the storage node"
	logs := newLogCounter(waitLine)
	_, err := Open(ctx, Options{StoreAddr: addr, OwnerID: owner, OwnerInUseWait: 300 * time.Millisecond, Logger: slog.New(logs)})
	require.ErrorIs(t, err, ErrOwnerInUse)
	require.NotContains(t, err.Error(), "epoch")
	require.Equal(t, 1, logs.count(waitLine), "one line for the wait, not one a retry")
	wg.Wait()
	require.False(t, t.Failed())

	// A closes (Release): B gets in at once, with its tables and its batch sequence.
	require.NoError(t, a.Close(ctx))
	b := openDB(t, ctx, Options{StoreAddr: addr, OwnerID: owner, OwnerInUseWait: 300 * time.Millisecond})
	defer b.Close(ctx)
	tb := openTable(t, ctx, b, "acct")
	gone := make(map[uint64]bool)
	for _, id := range deleted {
		gone[id] = true
	}
	got := make([]byte, 64)
	for _, r := range done {
		err := tb.Get(ctx, r.id, got)
		if gone[r.id] {
			require.ErrorIs(t, err, ErrNotFound, "row %d was deleted", r.id)
			continue
		}
		require.NoError(t, err, "acknowledged row %d", r.id)
		require.Equal(t, r.v, binary.LittleEndian.Uint64(got), "row %d", r.id)
	}
	_, err = tb.Insert(ctx, row(7))
	require.NoError(t, err, "B continues A's seqs")
	st := srv.Engine().Stats()
	require.Zero(t, st.RetriedBatches)
}

// halfProxy forwards TCP connections to a storage node and can cut the client side of every
// connection while leaving the storage node's side open and silent, as a NAT timeout or a
// client-side network reset does: the storage node still sees the old connection open.
type halfProxy struct {
	proxyConns // client side, node side, of each connection in turn
	target     string
	cuts       atomic.Int64
}

func startHalfProxy(t *testing.T, target string) *halfProxy {
	p := &halfProxy{target: target}
	p.ln = listenLoopback(t)
	acceptPairs(p.ln, target, &p.wg, func(c, s net.Conn) {
		p.add(c, s)
		go p.forward(s, c, nil) // never closes the node's side
		go p.forward(c, s, nil)
	})
	t.Cleanup(p.close)
	return p
}

// cutClients closes the client side of every connection so far.
func (p *halfProxy) cutClients() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := 0; i < len(p.conns); i += 2 {
		p.conns[i].Close()
	}
	p.cuts.Add(1)
}

// The client side of the connection drops mid-load while the storage node still sees it
// open: the node reconnects with the same incarnation (replacing the old connection at once)
// and resends its batches in flight; every one is acknowledged exactly once and applied once.
func TestClientSideDropMidLoad(t *testing.T) {
	ctx := context.Background()
	addr, srv := startIdentityNode(t, storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone})
	proxy := startHalfProxy(t, addr)
	db := openDB(t, ctx, Options{StoreAddr: proxy.ln.Addr().String(), OwnerID: 0x77})
	defer db.Close(ctx)
	tb := newTable(t, ctx, db, "ctr", 64)

	workers, per := 16, 150
	if testing.Short() {
		workers, per = 6, 60
	}
	ids := make([]uint64, workers)
	for w := range ids {
		ids[w] = insertRow(t, ctx, tb, row(0))
	}
	var total atomic.Int64
	cutAt := int64(workers * per / 3)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got := make([]byte, 64)
			for range per {
				err := db.Update(ctx, func(tx *Tx) error {
					if err := tx.Get(tb, ids[w], got); err != nil {
						return err
					}
					return tx.Put(tb, ids[w], row(binary.LittleEndian.Uint64(got)+1))
				})
				if err != nil {
					t.Errorf("worker %d: %v", w, err)
					return
				}
				if total.Add(1) == cutAt {
					proxy.cutClients()
				}
			}
		}()
	}
	wg.Wait()
	require.False(t, t.Failed())
	require.Equal(t, int64(1), proxy.cuts.Load())

	// Every increment acknowledged once is there once: each counter is exactly per.
	// And the storage node applied each batch once: its applied commits are the seqs 1..n.
	requireEachAppliedOnce(t, ctx, srv, db, tb, ids, per, 0x77, "worker")
}

// How an fsync error reaches the caller: the storage node's WAL fsync fails for a commit
// batch; the commit returns ErrUnknownOutcome (it may survive a restart), embedded and over
// TCP alike, never a plain failure. Fails on 767c454 (a fail-stop error).
func TestFsyncErrorIsUnknownOutcome(t *testing.T) {
	for _, remote := range []bool{false, true} {
		name := map[bool]string{false: "embedded", true: "remote"}[remote]
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			fs := vfs.NewFaultFS()
			opts := storenode.Options{Dir: "db", FS: fs, Sync: storenode.SyncAlways, ExpireLeasesAtOpen: !remote}
			var db *DB
			var err error
			if remote {
				addr, _ := startIdentityNode(t, opts)
				db, err = Open(ctx, Options{StoreAddr: addr})
			} else {
				var s store.Store
				s, err = store.OpenEmbedded(opts)
				require.NoError(t, err)
				db, err = Open(ctx, Options{Store: s})
			}
			require.NoError(t, err)
			defer db.Close(ctx)
			tb := newTable(t, ctx, db, "t", 64)
			id := insertRow(t, ctx, tb, row(1))
			fs.Inject(func(op vfs.Op) error {
				if op.Kind == vfs.OpSync && strings.Contains(op.Name, "wal/") {
					return syscall.EIO
				}
				return nil
			})
			err = tb.Put(ctx, id, row(2))
			require.ErrorIs(t, err, ErrUnknownOutcome)
			fs.Inject(nil)
		})
	}
}
