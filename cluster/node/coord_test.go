package node_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/storenode/server"
	"github.com/weftdb/weft/txnode"
)

// startTxnCluster is startCluster with the storage nodes' two-phase commit wired as
// cmd/storenode -etcd wires it: etcd as the lease checker (cluster.Client.LeaseAlive), the
// other storage nodes as peers (server.NewTxnPeer, the map's nodes only); tune adjusts each storage node's options
// (the resolver's timing).
func startTxnCluster(t *testing.T, storageNodes int, tune func(*storenode.Options)) *testCluster {
	t.Helper()
	tc := newTestCluster(t)
	c := tc.c
	v := cluster.NewGrantVerifier(c, storenode.ErrFenced)
	for range storageNodes {
		peer := server.NewTxnPeer(server.PeerConfig{Secret: peerSecret, Directory: c})
		opts := storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone, GrantVerifier: v, LeaseChecker: c, TxnPeer: peer}
		if tune != nil {
			tune(&opts)
		}
		tc.addServer(t, opts, func() { peer.Close() })
	}
	return tc
}

// twoAccounts opens node 0xa ("game-a:7000") on tc (two storage nodes), creates "acct" with
// one partition on each, owns both and inserts an account of balance initial on each: x and
// y, on different storage nodes (x's is a transaction's primary when x is written first).
func twoAccounts(t *testing.T, ctx context.Context, tc *testCluster) (a *node.Node, ta *node.Table, x, y uint64) {
	t.Helper()
	a = tc.open(t, 0xa, "game-a:7000")
	ta = createTable(t, ctx, a, "acct", 64, 2, 1, tc.addrs)
	require.NoError(t, ta.Own(ctx, 0, 1))
	x = insertRow(t, ctx, ta, acctRow(initial, 0))
	y = insertRow(t, ctx, ta, acctRow(initial, 0))
	require.NotEqual(t, ta.NodeOf(x), ta.NodeOf(y))
	return a, ta, x, y
}

// startTwoAccounts starts a cluster of two two-phase-commit storage nodes (startTxnCluster)
// and sets up twoAccounts on it.
func startTwoAccounts(t *testing.T, ctx context.Context) (tc *testCluster, a *node.Node, ta *node.Table, x, y uint64) {
	t.Helper()
	tc = startTxnCluster(t, 2, nil)
	a, ta, x, y = twoAccounts(t, ctx, tc)
	return tc, a, ta, x, y
}

// shutDownWhenPrepared makes the coordinator prepare its parts one at a time and shuts the
// storage node second down once the first prepare is answered (step "prepared", one
// answered), so the second part's prepare is never answered; it returns what restores both
// hooks.
func shutDownWhenPrepared(second *server.Server) (restore func()) {
	serial := node.SetSerialPrepares(true)
	hook := node.SetCoordHook(func(step string, i int) {
		if step == "prepared" && i == 1 {
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			second.Shutdown(sctx)
			cancel()
		}
	})
	return func() {
		hook()
		serial()
	}
}

// srvAt returns tc's storage node listening at addr (nil if none).
func (tc *testCluster) srvAt(addr string) *server.Server {
	for i, a := range tc.addrs {
		if a == addr {
			return tc.srvs[i]
		}
	}
	return nil
}

// A bank row: the balance, then how many transfers the account received.
func acctRow(balance, received uint64) []byte {
	b := make([]byte, 64)
	binary.LittleEndian.PutUint64(b, balance)
	binary.LittleEndian.PutUint64(b[8:], received)
	return b
}

func receivedOf(row []byte) uint64 { return binary.LittleEndian.Uint64(row[8:]) }

// xfer moves up to amount (what the balance allows) between two accounts and counts the
// transfer at the receiver: the received counts sum to the acknowledged transfers.
func xfer(ctx context.Context, n *node.Node, t *node.Table, from, to, amount uint64) error {
	return n.Update(ctx, func(tx *node.Tx) error {
		f, g, err := getPair(tx, t, from, to)
		if err != nil {
			return err
		}
		amount = min(amount, balanceOf(f))
		if err := tx.Put(t, from, acctRow(balanceOf(f)-amount, receivedOf(f))); err != nil {
			return err
		}
		return tx.Put(t, to, acctRow(balanceOf(g)+amount, receivedOf(g)+1))
	})
}

// sums reads accounts in one read-only transaction of n (over every storage node).
func sums(ctx context.Context, n *node.Node, t *node.Table, ids []uint64) (balance, received uint64, err error) {
	err = n.View(ctx, func(tx *node.Tx) error {
		balance, received = 0, 0
		dst := make([]byte, 64)
		for _, id := range ids {
			if err := tx.Get(t, id, dst); err != nil {
				return err
			}
			balance += balanceOf(dst)
			received += receivedOf(dst)
		}
		return nil
	})
	return
}

// A bank over 3 storage nodes and 2 cluster nodes, accounts in every partition (each node
// owns half of them, two on every storage node), concurrent transfers mostly ACROSS storage
// nodes (two-phase commit), some within one (one batch): the total is conserved, every
// acknowledged transfer is there (the received counts sum to them), and read-only
// transactions over every storage node, running meanwhile, always see the conserved total
// (serializable across storage nodes). In both durability modes (WriteBack: a prepare first
// flushes the rows dirty so far).
func TestBankAcrossStorageNodes(t *testing.T) {
	t.Run("durable", func(t *testing.T) { bankAcross(t, txnode.Durable) })
	t.Run("writeback", func(t *testing.T) { bankAcross(t, txnode.WriteBack) })
}

func bankAcross(t *testing.T, durability txnode.Durability) {
	ctx := testCtx(t)
	perNode, transfers, workers := 24, 60, 2
	if testing.Short() {
		perNode, transfers, workers = 12, 20, 1
	}
	tc := startTxnCluster(t, 3, nil)
	a := tc.openConfig(t, node.Config{Session: cluster.SessionConfig{Owner: 0xa, Addr: "game-a:7000"}, Durability: durability})
	b := tc.openConfig(t, node.Config{Session: cluster.SessionConfig{Owner: 0xb, Addr: "game-b:7000"}, Durability: durability})
	ta := createTable(t, ctx, a, "acct", 64, partitions, 1, tc.addrs)
	tb := openTable(t, ctx, b, "acct")
	require.NoError(t, ta.Own(ctx, parts(partitions, 0)...))
	require.NoError(t, tb.Own(ctx, parts(partitions, 1)...))
	var accts [2][]uint64
	for i, tbl := range []*node.Table{ta, tb} {
		for range perNode {
			id := insertRow(t, ctx, tbl, acctRow(initial, 0))
			accts[i] = append(accts[i], id)
		}
	}
	want := uint64(perNode) * initial

	var wg sync.WaitGroup
	errs := make(chan error, 4*workers)
	acked := [2]uint64{}
	var ackMu sync.Mutex
	stop := make(chan struct{})
	var checkers sync.WaitGroup
	for i, n := range []*node.Node{a, b} {
		tbl := []*node.Table{ta, tb}[i]
		ids := accts[i]
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(i), uint64(w)))
				for k := range transfers {
					from, to := ids[rng.IntN(len(ids))], ids[rng.IntN(len(ids))]
					for from == to || (k%4 != 0) == (tbl.NodeOf(from) == tbl.NodeOf(to)) {
						from, to = ids[rng.IntN(len(ids))], ids[rng.IntN(len(ids))]
					}
					if err := xfer(ctx, n, tbl, from, to, uint64(1+rng.IntN(50))); err != nil {
						errs <- fmt.Errorf("node %d: transfer %d -> %d: %w", i, from, to, err)
						return
					}
					ackMu.Lock()
					acked[i]++
					ackMu.Unlock()
				}
			}()
		}
		checkers.Add(1)
		go func() {
			defer checkers.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				bal, _, err := sums(ctx, n, tbl, ids)
				if err != nil {
					errs <- fmt.Errorf("node %d: view: %w", i, err)
					return
				}
				if bal != want {
					errs <- fmt.Errorf("node %d: a read-only transaction saw a total of %d, not %d", i, bal, want)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	checkers.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for i, n := range []*node.Node{a, b} {
		bal, rec, err := sums(ctx, n, []*node.Table{ta, tb}[i], accts[i])
		require.NoError(t, err)
		require.Equal(t, want, bal, "node %d: the total is conserved", i)
		require.Equal(t, acked[i], rec, "node %d: every acknowledged transfer is there", i)
	}
	if durability == txnode.WriteBack {
		require.NoError(t, a.Close(ctx)) // flushes
		require.NoError(t, b.Close(ctx))
	}
	require.Equal(t, 2*want, total(t, tc, accts), "the storage nodes' durable rows conserve the total")
	for _, srv := range tc.srvs {
		parts, _ := srv.Engine().TxnCounts()
		require.Zero(t, parts, "no transaction left prepared")
	}
}

// A two-phase commit's prepared rows are locked in the owner's own cache until the
// decision: a local read of one waits (here until its context ends) and never sees the
// prepared bytes; once the commit is applied it sees the committed values.
func TestPreparedRowsLockedInOwnerCache(t *testing.T) {
	ctx := testCtx(t)
	_, a, ta, x, y := startTwoAccounts(t, ctx)

	decided := make(chan struct{})
	release := make(chan struct{})
	restore := node.SetCoordHook(func(step string, _ int) {
		if step == "prepared-all" {
			close(decided)
			<-release
		}
	})
	defer restore()
	done := make(chan error, 1)
	go func() { done <- xfer(ctx, a, ta, x, y, 10) }()
	select {
	case <-decided:
	case <-ctx.Done():
		t.Fatal("never prepared")
	}
	// Both rows are prepared (locked) now.
	dst := make([]byte, 64)
	for _, id := range []uint64{x, y} {
		short, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
		err := ta.Get(short, id, dst)
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded, "a local read of a prepared row waits")
		short, cancel = context.WithTimeout(ctx, 30*time.Millisecond)
		err = ta.Put(short, id, acctRow(1, 0))
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded, "a local write of a prepared row waits")
	}
	got := make(chan uint64, 1)
	go func() {
		d := make([]byte, 64)
		if err := ta.Get(ctx, x, d); err != nil {
			got <- 0
			return
		}
		got <- balanceOf(d)
	}()
	close(release)
	require.NoError(t, <-done)
	require.Equal(t, uint64(initial-10), <-got, "the waiting reader sees the committed value")
	requireBalance(t, ctx, ta, y, dst, initial+10)
}

// Write skew across storage nodes: T1 reads r (storage node A) and writes y (A) and x = r+1
// (B); T2, run in full between T1's two prepares (A prepared, B not yet), reads x and writes
// r = x+10. T2 commits (nothing it touches is locked yet); T1's reads are validated again
// once all its writes are locked, finds r changed and runs again, so the outcome is one of
// the serial ones: never x == 1 with r == 10 (each having read the other's old value).
func TestTwoPhaseCommitNoWriteSkew(t *testing.T) {
	ctx := testCtx(t)
	tc := startTxnCluster(t, 2, nil)
	a := tc.open(t, 0xa, "game-a:7000")
	ta := createTable(t, ctx, a, "acct", 64, 2, 1, tc.addrs)
	require.NoError(t, ta.Own(ctx, 0, 1))
	byNode := map[string][]uint64{}
	for range 4 {
		id := insertRow(t, ctx, ta, acctRow(0, 0))
		byNode[ta.NodeOf(id)] = append(byNode[ta.NodeOf(id)], id)
	}
	require.Len(t, byNode, 2)
	r, y, x := byNode[tc.addrs[0]][0], byNode[tc.addrs[0]][1], byNode[tc.addrs[1]][0]

	val := func(tx *node.Tx, id uint64) (uint64, error) {
		d := make([]byte, 64)
		err := tx.Get(ta, id, d)
		return balanceOf(d), err
	}
	t2 := func() error {
		return a.Update(ctx, func(tx *node.Tx) error {
			xv, err := val(tx, x)
			if err != nil {
				return err
			}
			return tx.Put(ta, r, acctRow(xv+10, 0))
		})
	}
	defer node.SetSerialPrepares(true)()
	var fired atomic.Bool // T2's own prepares call the hook too
	t2err := make(chan error, 1)
	defer node.SetCoordHook(func(step string, i int) {
		if step == "prepared" && i == 1 && fired.CompareAndSwap(false, true) {
			t2err <- t2()
		}
	})()
	runs := 0
	require.NoError(t, a.Update(ctx, func(tx *node.Tx) error {
		runs++
		rv, err := val(tx, r)
		if err != nil {
			return err
		}
		if err := tx.Put(ta, y, acctRow(1, 0)); err != nil { // A written first: A is prepared first
			return err
		}
		return tx.Put(ta, x, acctRow(rv+1, 0))
	}))
	require.NoError(t, <-t2err)
	dst := make([]byte, 64)
	require.NoError(t, ta.Get(ctx, r, dst))
	rv := balanceOf(dst)
	require.NoError(t, ta.Get(ctx, x, dst))
	xv := balanceOf(dst)
	require.False(t, xv == 1 && rv == 10, "write skew: x = %d, r = %d", xv, rv)
	require.Equal(t, [2]uint64{11, 10}, [2]uint64{xv, rv}, "T2 then T1")
	require.Equal(t, 2, runs, "T1 ran again after its validation failed")
}
