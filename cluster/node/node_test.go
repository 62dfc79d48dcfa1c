package node_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/logicpage"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/txnode"
)

const (
	partitions = 12 // p on storage node p%3: each node owns two partitions on every storage node
	initial    = 1000
)

// bankSetup creates "acct" over 3 storage nodes and opens two cluster nodes: a owns the even
// partitions, b the odd ones, and each inserts accounts into its own partitions.
func bankSetup(t *testing.T, perNode int) (tc *testCluster, a, b *node.Node, ta, tb *node.Table, accts [2][]uint64) {
	ctx := testCtx(t)
	tc = startCluster(t, 3)
	a = tc.open(t, 0xa, "game-a:7000")
	b = tc.open(t, 0xb, "game-b:7000")
	ta = createTable(t, ctx, a, "acct", 64, partitions, 1, tc.addrs)
	tb = openTable(t, ctx, b, "acct")
	require.NoError(t, ta.Own(ctx, parts(partitions, 0)...))
	require.NoError(t, tb.Own(ctx, parts(partitions, 1)...))
	for i, tbl := range []*node.Table{ta, tb} {
		for range perNode {
			id := insertRow(t, ctx, tbl, balanceRow(initial))
			accts[i] = append(accts[i], id)
		}
	}
	return
}

// total reads every account afresh, through a third node that owns nothing: every
// partition's durable rows on its storage node.
func total(t *testing.T, tc *testCluster, accts [2][]uint64) uint64 {
	ctx := testCtx(t)
	_, tbl := tc.openNodeTable(t, ctx, 0xc, "acct")
	dst := make([]byte, 64)
	var sum uint64
	for _, ids := range accts {
		for _, id := range ids {
			require.NoError(t, tbl.Get(ctx, id, dst), "account %d", id)
			sum += balanceOf(dst)
		}
	}
	return sum
}

// transfer moves amount from one account to another in one transaction, if the balance
// allows.
func transfer(ctx context.Context, n *node.Node, t *node.Table, from, to, amount uint64) error {
	return n.Update(ctx, func(tx *node.Tx) error {
		f, g, err := getPair(tx, t, from, to)
		if err != nil {
			return err
		}
		if balanceOf(f) < amount {
			return nil
		}
		if err := tx.Put(t, from, balanceRow(balanceOf(f)-amount)); err != nil {
			return err
		}
		return tx.Put(t, to, balanceRow(balanceOf(g)+amount))
	})
}

// A bank over 3 storage nodes and 2 cluster nodes, each owning half the partitions (two on
// every storage node): concurrent transfers between accounts of one node on one storage node
// (across partitions too) commit atomically; the total read afresh from every storage node at
// the end is conserved. A transfer across storage nodes commits too (two-phase commit:
// TestBankAcrossStorageNodes runs many).
func TestBank(t *testing.T) {
	ctx := testCtx(t)
	perNode, transfers, workers := 48, 150, 2
	if testing.Short() {
		perNode, transfers, workers = 24, 40, 1
	}
	tc, a, b, ta, tb, accts := bankSetup(t, perNode)
	want := uint64(2*perNode) * initial

	// Inserts spread round robin over the owned partitions: perNode/6 in each.
	for i, tbl := range []*node.Table{ta, tb} {
		count := map[uint32]int{}
		for _, id := range accts[i] {
			p := tbl.Partition(id)
			require.EqualValues(t, i, p%2, "account %d of node %d in partition %d", id, i, p)
			count[p]++
		}
		require.Len(t, count, partitions/2)
		for p, c := range count {
			require.Equal(t, perNode/(partitions/2), c, "partition %d", p)
		}
	}

	// Accounts by storage node, per cluster node: transfers pick both ends on one.
	type key struct {
		node int
		addr string
	}
	byStore := map[key][]uint64{}
	for i, tbl := range []*node.Table{ta, tb} {
		for _, id := range accts[i] {
			k := key{i, tbl.NodeOf(id)}
			byStore[k] = append(byStore[k], id)
		}
	}
	var crossPairs int
	for i, tbl := range []*node.Table{ta, tb} {
		for _, from := range accts[i] {
			for _, to := range accts[i] {
				if tbl.NodeOf(from) != tbl.NodeOf(to) && crossPairs == i {
					require.NoError(t, transfer(ctx, []*node.Node{a, b}[i], tbl, from, to, 1))
					crossPairs++
				}
			}
		}
	}
	require.Equal(t, 2, crossPairs)

	var wg sync.WaitGroup
	errs := make(chan error, 2*workers)
	for i, n := range []*node.Node{a, b} {
		tbl := []*node.Table{ta, tb}[i]
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(i), uint64(w)))
				addrs := tc.addrs
				for range transfers {
					ids := byStore[key{i, addrs[rng.IntN(len(addrs))]}]
					from, to := ids[rng.IntN(len(ids))], ids[rng.IntN(len(ids))]
					if from == to {
						continue
					}
					if err := transfer(ctx, n, tbl, from, to, uint64(1+rng.IntN(50))); err != nil {
						errs <- fmt.Errorf("node %d: %w", i, err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, want, total(t, tc, accts), "the total is conserved")
}

// Rows route by id to their partition's storage node; writes to another node's partition
// fail with ErrNotOwner naming the holder's address; reads of it are served from the storage
// node's durable rows; inside a transaction, a read of it is ErrNotOwner too.
func TestRoutingAndNotOwner(t *testing.T) {
	ctx := testCtx(t)
	tc, a, _, ta, tb, accts := bankSetup(t, 12)
	aID, bID := accts[0][0], accts[1][0]

	// Each row is on its partition's storage node, in the partition's table there.
	for i, ids := range accts {
		for _, id := range ids {
			p := ta.Partition(id)
			addr := ta.NodeOf(id)
			require.Equal(t, tc.addrs[p%3], addr)
			srv := tc.srvs[p%3]
			ti, err := srv.Engine().OpenTable(base.PartitionTableName("acct", p))
			require.NoError(t, err)
			data, _, rows, err := srv.Engine().ReadRows(ti.ID, id/64, 1<<(id%64), nil)
			require.NoError(t, err)
			require.Equal(t, uint64(1)<<(id%64), data, "node %d's account %d not on %s", i, id, addr)
			require.EqualValues(t, initial, balanceOf(rows))
		}
	}

	// b's row, written by a: the holder is named.
	err := ta.Put(ctx, bID, balanceRow(5))
	require.ErrorIs(t, err, node.ErrNotOwner)
	var ne *node.NotOwnerError
	require.ErrorAs(t, err, &ne)
	require.True(t, ne.Held)
	require.Equal(t, "game-b:7000", ne.Holder.Addr)
	require.EqualValues(t, 0xb, ne.Holder.Owner)
	require.Equal(t, ta.Partition(bID), ne.Part)
	require.ErrorIs(t, ta.Update(ctx, bID, func([]byte) error { return nil }), node.ErrNotOwner)
	require.ErrorIs(t, ta.Delete(ctx, bID), node.ErrNotOwner)
	err = ta.Own(ctx, ta.Partition(bID))
	require.ErrorAs(t, err, &ne)
	require.Equal(t, "game-b:7000", ne.Holder.Addr)

	// A read of b's row from a: the durable row, as b committed it (Durable mode).
	require.NoError(t, tb.Put(ctx, bID, balanceRow(777)))
	dst := make([]byte, 64)
	requireBalance(t, ctx, ta, bID, dst, 777)
	require.ErrorIs(t, ta.Get(ctx, bID+1<<30, dst), txnode.ErrNotFound)

	// Inside a's transaction, b's row is not readable (nor anything after it), whatever
	// the closure does with the error; a's own row is unchanged.
	err = a.Update(ctx, func(tx *node.Tx) error {
		if err := tx.Put(ta, aID, balanceRow(1)); err != nil {
			return err
		}
		_ = tx.Get(ta, bID, dst) // ignored: Update fails all the same
		return nil
	})
	require.ErrorIs(t, err, node.ErrNotOwner)
	require.ErrorAs(t, err, &ne)
	require.Equal(t, "game-b:7000", ne.Holder.Addr)
	requireBalance(t, ctx, ta, aID, dst, initial, "the failed transaction wrote nothing")

	// A transaction whose first access is on another node's partition.
	err = a.Update(ctx, func(tx *node.Tx) error { return tx.Get(ta, bID, dst) })
	require.ErrorIs(t, err, node.ErrNotOwner)

	// An insert in a transaction goes to an owned partition on the transaction's storage
	// node; a closure that touches nothing commits nothing.
	var newID uint64
	require.NoError(t, a.Update(ctx, func(tx *node.Tx) error {
		if err := tx.Get(ta, aID, dst); err != nil {
			return err
		}
		var err error
		newID, err = tx.Insert(ta, balanceRow(3))
		return err
	}))
	require.Equal(t, ta.NodeOf(aID), ta.NodeOf(newID))
	require.EqualValues(t, 0, ta.Partition(newID)%2)
	require.NoError(t, a.Update(ctx, func(*node.Tx) error { return nil }))
	tbB, err := tc.open(t, 0xd, "").OpenTable(ctx, "acct") // another Node's handle
	require.NoError(t, err)
	err = a.Update(ctx, func(tx *node.Tx) error { return tx.Get(tbB, aID, dst) })
	require.ErrorIs(t, err, cluster.ErrInvalid)
	err = a.Update(ctx, func(tx *node.Tx) error { _, err := tx.Insert(tbB, balanceRow(1)); return err })
	require.ErrorIs(t, err, cluster.ErrInvalid)
	// A closure that panics on any error of tx (the first run's internal one included)
	// commits all the same; a panic of its own goes on up.
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}
	require.NoError(t, a.Update(ctx, func(tx *node.Tx) error {
		must(tx.Get(ta, aID, dst))
		must(tx.Put(ta, aID, balanceRow(balanceOf(dst)+1)))
		return nil
	}))
	require.NoError(t, ta.Get(ctx, aID, dst))
	require.EqualValues(t, initial+1, balanceOf(dst))
	require.PanicsWithValue(t, "own", func() {
		a.Update(ctx, func(tx *node.Tx) error { panic("own") })
	})
	require.PanicsWithValue(t, "own", func() {
		a.Update(ctx, func(tx *node.Tx) error {
			if err := tx.Get(ta, aID, dst); err != nil {
				return err
			}
			panic("own")
		})
	})
	// A read-only transaction: reads of owned partitions, a write refused, a partition not
	// owned refused.
	var sum uint64
	require.NoError(t, a.View(ctx, func(tx *node.Tx) error {
		sum = 0
		for _, id := range []uint64{aID, newID} {
			if err := tx.Get(ta, id, dst); err != nil {
				return err
			}
			sum += balanceOf(dst)
		}
		return nil
	}))
	require.EqualValues(t, initial+1+3, sum)
	require.ErrorIs(t, a.View(ctx, func(tx *node.Tx) error { return tx.Put(ta, aID, dst) }), txnode.ErrReadOnly)
	require.ErrorIs(t, a.View(ctx, func(tx *node.Tx) error { return tx.Get(ta, bID, dst) }), node.ErrNotOwner)
	sentinel := errors.New("mine")
	require.ErrorIs(t, a.Update(ctx, func(*node.Tx) error { return sentinel }), sentinel)

	// A table of another layout under the name is refused; the same arguments again are a
	// retry that returns the table.
	_, err = a.CreateTable(ctx, "acct", 64, partitions+1, 1, tc.addrs)
	require.ErrorIs(t, err, cluster.ErrTableExists)
	_, err = a.CreateTable(ctx, "acct", 128, partitions, 1, tc.addrs)
	require.ErrorIs(t, err, cluster.ErrTableExists)
	again := createTable(t, ctx, a, "acct", 64, partitions, 1, tc.addrs)
	require.Same(t, ta, again)
}

// A creation that stopped after the partition map was written (a crash) is reported by
// OpenTable (ErrIncomplete) and completed by CreateTable with the same arguments.
func TestCreateTableCompletes(t *testing.T) {
	ctx := testCtx(t)
	tc := startCluster(t, 3)
	// Step 1 only, and one partition's table of step 2.
	_, err := tc.c.CreateTable(ctx, "half", cluster.Layout{Partitions: 3, StripePages: 2}, tc.addrs)
	require.NoError(t, err)
	_, err = tc.srvs[1].Engine().CreateClusterTable(base.PartitionTableName("half", 1), 64,
		base.ClusterLayout{Partitions: 3, StripePages: 2, Partition: 1})
	require.NoError(t, err)
	a := tc.open(t, 0xa, "game-a:7000")
	_, err = a.OpenTable(ctx, "half")
	require.ErrorIs(t, err, node.ErrIncomplete)
	require.ErrorContains(t, err, "partition 0")
	tbl := createTable(t, ctx, a, "half", 64, 3, 2, tc.addrs)
	require.NoError(t, tbl.Own(ctx, 0, 1, 2))
	ids := map[uint32]bool{}
	for range 6 {
		id := insertRow(t, ctx, tbl, balanceRow(1))
		ids[tbl.Partition(id)] = true
	}
	require.Len(t, ids, 3)
	// What a storage node would refuse is refused before the map is written.
	for _, bad := range []struct {
		name     string
		rowBytes int
		want     error
	}{{"odd", 7, logicpage.ErrRowSize}, {"a b", 64, storenode.ErrBadName}, {strings.Repeat("x", 62), 64, storenode.ErrBadName}} {
		_, err := a.CreateTable(ctx, bad.name, bad.rowBytes, 12, 1, tc.addrs)
		require.ErrorIs(t, err, bad.want, bad.name)
		m, err := tc.c.ReadMap(ctx)
		require.NoError(t, err)
		require.NotContains(t, m.Tables, bad.name)
	}
	b := tc.open(t, 0xb, "")
	openTable(t, ctx, b, "half")
	_, err = b.OpenTable(ctx, "nope")
	require.ErrorIs(t, err, cluster.ErrTableNotFound)
}

// A node whose session is closed loses its partitions: the other node takes them over and
// continues (its transfers over the accounts of both commit, the total is conserved); the
// first node's writes fail with ErrNotOwner naming the new holder, and its reads are served
// from the storage nodes' durable rows.
func TestTakeover(t *testing.T) {
	ctx := testCtx(t)
	tc, a, b, ta, tb, accts := bankSetup(t, 12)
	want := uint64(24) * initial
	aID := accts[0][0]
	require.NoError(t, transfer(ctx, a, ta, aID, accts[0][6], 10))

	require.NoError(t, a.Session().Close(ctx))
	require.NoError(t, tb.OwnWait(ctx, parts(partitions, 0)...))
	require.Len(t, tb.Owned(), partitions)

	// b moves money between a's old accounts and its own, on each storage node.
	all := append(append([]uint64(nil), accts[0]...), accts[1]...)
	for i, from := range all {
		for _, to := range all[i+1:] {
			if tb.NodeOf(from) == tb.NodeOf(to) && tb.Partition(from)%2 != tb.Partition(to)%2 {
				require.NoError(t, transfer(ctx, b, tb, from, to, 3))
				break
			}
		}
	}
	moved := 0
	for _, to := range accts[1] {
		if tb.NodeOf(to) == tb.NodeOf(aID) {
			require.NoError(t, transfer(ctx, b, tb, aID, to, 100))
			moved++
		}
	}
	require.NotZero(t, moved)
	bView := make([]byte, 64)
	require.NoError(t, tb.Get(ctx, aID, bView))

	// a: every write refused, naming b; reads durable (b's value).
	var ne *node.NotOwnerError
	err := ta.Put(ctx, aID, balanceRow(initial))
	require.ErrorAs(t, err, &ne)
	require.Equal(t, "game-b:7000", ne.Holder.Addr)
	err = transfer(ctx, a, ta, accts[0][1], accts[0][7], 1)
	require.ErrorIs(t, err, node.ErrNotOwner)
	_, err = ta.Insert(ctx, balanceRow(1))
	require.ErrorIs(t, err, node.ErrNotOwner)
	require.Empty(t, ta.Owned())
	dst := make([]byte, 64)
	require.NoError(t, ta.Get(ctx, aID, dst))
	require.Equal(t, bView, dst, "a reads b's durable row")
	require.Less(t, balanceOf(dst), uint64(initial))
	require.ErrorContains(t, ta.Own(ctx, 0), "reopen")
	require.Equal(t, want, total(t, tc, accts), "the total is conserved")
}

// Reads of a partition this node does not own come from the storage node's durable rows:
// what the owner holds in its cache and has not flushed (WriteBack) is not seen, until it is.
func TestNonOwnedReadsDurableRows(t *testing.T) {
	ctx := testCtx(t)
	tc := startCluster(t, 1)
	a := tc.open(t, 0xa, "game-a:7000")
	b := tc.openConfig(t, node.Config{Session: cluster.SessionConfig{Owner: 0xb, Addr: "game-b:7000"},
		Durability: txnode.WriteBack, FlushInterval: 1 << 40})
	ta := createTable(t, ctx, a, "acct", 64, 2, 1, tc.addrs)
	tb := openTable(t, ctx, b, "acct")
	// An insert before any Own says which call is missing (fails on 678405d: the error named
	// no call; issue 23 item 4).
	_, err := tb.Insert(ctx, balanceRow(42))
	require.ErrorIs(t, err, node.ErrNotOwner)
	require.ErrorContains(t, err, "Table.Own or OwnWait")
	require.NoError(t, tb.Own(ctx, 1))
	id := insertRow(t, ctx, tb, balanceRow(42))
	dst := make([]byte, 64)
	require.NoError(t, tb.Get(ctx, id, dst), "the owner sees its cached row")
	require.EqualValues(t, 42, balanceOf(dst))
	require.ErrorIs(t, ta.Get(ctx, id, dst), txnode.ErrNotFound, "not durable yet: not served to a non-owner")
	require.NoError(t, b.Close(ctx)) // flushes
	requireBalance(t, ctx, ta, id, dst, 42)
	// b's Close released the partition: a takes it at once.
	require.NoError(t, ta.Own(ctx, 1))
	require.NoError(t, ta.Put(ctx, id, balanceRow(43)))
}

// A node cut off from etcd stops writing at its deadline; its lease expires and the other
// node, waiting (OwnWait), takes its partitions and continues; when the first hears its lease
// is gone, its writes fail with ErrNotOwner naming the new holder. Nothing it was refused is
// stored.
func TestTakeoverAfterLeaseExpiry(t *testing.T) {
	ctx := testCtx(t)
	tc := startCluster(t, 3)
	px := tc.etcdProxy(t)
	a := tc.openConfig(t, node.Config{Etcd: cluster.Config{Endpoints: []string{px.Endpoint()}},
		Session: cluster.SessionConfig{Owner: 0xa, Addr: "game-a:7000", TTL: cluster.TTLMin}, OwnerLookupTimeout: 500 * time.Millisecond})
	b := tc.open(t, 0xb, "game-b:7000")
	ta := createTable(t, ctx, a, "acct", 64, 6, 1, tc.addrs)
	tb := openTable(t, ctx, b, "acct")
	require.NoError(t, ta.Own(ctx, 0, 1, 2))
	id := insertRow(t, ctx, ta, balanceRow(initial))

	px.Cut(true)
	require.NoError(t, tb.OwnWait(ctx, 0, 1, 2), "b takes a's partitions once a's lease expired")
	require.NoError(t, tb.Update(ctx, id, func(r []byte) error { copy(r, balanceRow(initial+1)); return nil }))
	err := ta.Put(ctx, id, balanceRow(5))
	require.ErrorIs(t, err, txnode.ErrLeaseExpired, "a past its deadline writes nothing")
	require.ErrorIs(t, err, cluster.ErrLapsed)
	// A write to a partition a never owned, while a cannot reach etcd: refused within the
	// lookup's bound, the holder unknown.
	other, ok := ta.Layout().Next(0, 4)
	require.True(t, ok)
	err = ta.Put(ctx, other, balanceRow(5))
	require.ErrorIs(t, err, node.ErrNotOwner)
	require.ErrorIs(t, err, cluster.ErrUnavailable)
	require.NoError(t, ctx.Err())

	px.Cut(false)
	select {
	case <-a.Session().Done(): // the keepalive heard the lease is gone
	case <-ctx.Done():
		t.Fatal("a never heard its lease expired")
	}
	var ne *node.NotOwnerError
	require.ErrorAs(t, ta.Put(ctx, id, balanceRow(6)), &ne)
	require.Equal(t, "game-b:7000", ne.Holder.Addr)
	dst := make([]byte, 64)
	require.NoError(t, ta.Get(ctx, id, dst))
	require.EqualValues(t, initial+1, balanceOf(dst), "b's write, read durably by a")
	require.NoError(t, tb.Get(ctx, id, dst))
	require.EqualValues(t, initial+1, balanceOf(dst))
}

// A node without the storage nodes' secret is refused by them: it opens no table.
func TestWrongSecretRefused(t *testing.T) {
	ctx := testCtx(t)
	tc := startCluster(t, 1)
	createTable(t, ctx, tc.open(t, 0xa, ""), "acct", 64, 2, 1, tc.addrs)
	bad := tc.openConfig(t, node.Config{Session: cluster.SessionConfig{Owner: 0xb},
		Secret: []byte("a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f91"), DialTimeout: 5 * time.Second})
	_, err := bad.OpenTable(ctx, "acct")
	require.ErrorIs(t, err, sgio.ErrAuthFailed)
	require.NotErrorIs(t, err, sgio.ErrWeakSecret)
}

// Own runs while inserts run: every insert lands in a partition owned when it was made, and
// the inserts spread over the new partitions too.
func TestOwnWhileInserting(t *testing.T) {
	ctx := testCtx(t)
	_, _, ta := startWithTable(t, ctx, 2, 0xa, "game-a:7000", "acct", 6)
	require.NoError(t, ta.Own(ctx, 0))
	inserts := 200
	if testing.Short() {
		inserts = 60
	}
	done := make(chan []uint64)
	go func() {
		var ids []uint64
		for range inserts {
			id, err := ta.Insert(ctx, balanceRow(1))
			if err != nil {
				break
			}
			ids = append(ids, id)
		}
		done <- ids
	}()
	for p := uint32(1); p < 6; p++ {
		require.NoError(t, ta.Own(ctx, p))
	}
	ids := <-done
	require.Len(t, ids, inserts)
	seen := map[uint64]bool{}
	dst := make([]byte, 64)
	for _, id := range ids {
		require.False(t, seen[id], "id %d twice", id)
		seen[id] = true
		require.NoError(t, ta.Get(ctx, id, dst))
	}
	// After the Owns, inserts reach every partition.
	parts := map[uint32]bool{}
	for range 6 {
		id := insertRow(t, ctx, ta, balanceRow(1))
		parts[ta.Partition(id)] = true
	}
	require.Len(t, parts, 6)
}
