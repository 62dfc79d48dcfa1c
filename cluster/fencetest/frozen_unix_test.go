//go:build unix

package fencetest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/etcdtest"
	"github.com/weftdb/weft/cluster/proctest"
	"github.com/weftdb/weft/internal/testkit"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/storenode/server"
	"github.com/weftdb/weft/txnode"
	"github.com/weftdb/weft/txnode/txncoord"
)

// helperEnv carries "etcd endpoint|storage node address" to TestHelperFrozenTxnode.
const helperEnv = "WEFT_FENCETEST_HELPER"

// childOwner is the frozen transaction node's owner id; takerOwner the one that takes over.
const childOwner, takerOwner = 0xc1, 0xc2

// TestHelperFrozenTxnode is the child of TestFrozenTxnodeFenced (it does nothing unless
// started by it): a transaction node over the storage node, owning partition 0 of "acct"
// under an etcd session of the shortest TTL, in WriteBack mode with flushes only on demand. It
// prints "ready", then answers one line per command on stdin: "insert V" commits a row and
// waits for it to be durable, "winsert V" commits one and leaves it unflushed, both printing
// "ok ID" or "err CLASS MESSAGE"; "flush" flushes (prints "ok" or "err ..."); "get ID" prints
// "ok V" or "err CLASS MESSAGE".
func TestHelperFrozenTxnode(t *testing.T) {
	spec := testkit.HelperSpec(t, helperEnv, "TestFrozenTxnodeFenced")
	endpoint, addr, _ := strings.Cut(spec, "|")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c, err := cluster.Connect(ctx, cluster.Config{Endpoints: []string{endpoint}, Prefix: prefix, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer c.Close()
	s, err := c.NewSession(ctx, cluster.SessionConfig{Owner: childOwner, TTL: cluster.TTLMin})
	require.NoError(t, err)
	db, err := txncoord.Open(ctx, txnode.Options{StoreAddr: addr, OwnerID: childOwner, Durability: txnode.WriteBack,
		FlushInterval: time.Hour, Logger: slog.New(slog.DiscardHandler)}, &cluster.TxGrants{Session: s})
	require.NoError(t, err)
	tb, err := db.Table(ctx, base.PartitionTableName("acct", 0))
	require.NoError(t, err)
	fmt.Printf("ready\n")
	class := func(err error) string {
		switch {
		case errors.Is(err, txnode.ErrLeaseExpired):
			return "expired"
		case errors.Is(err, storenode.ErrFenced):
			return "fenced"
		}
		return "other"
	}
	sess := db.Session()
	for line := range proctest.ChildInput() {
		cmd, arg, _ := strings.Cut(line, " ")
		n, _ := strconv.ParseUint(arg, 10, 64)
		switch cmd {
		case "insert", "winsert":
			var id uint64
			p := sess.Go(ctx, func(tx *txnode.Tx) error {
				var err error
				id, err = tx.Insert(tb, row(n))
				return err
			})
			var err error
			if cmd == "insert" {
				if err = sess.Flush(ctx); err == nil {
					err = p.Wait(ctx)
				}
			} else {
				select {
				case <-p.Done(): // resolved already: failed (nothing flushes before "flush")
					err = p.Wait(ctx)
				default:
				}
			}
			if err != nil {
				fmt.Printf("err %s %v\n", class(err), err)
				continue
			}
			fmt.Printf("ok %d\n", id)
		case "flush":
			if err := sess.Flush(ctx); err != nil {
				fmt.Printf("err %s %v\n", class(err), err)
				continue
			}
			fmt.Println("ok")
		case "get":
			dst := make([]byte, 64)
			if err := tb.Get(ctx, n, dst); err != nil {
				fmt.Printf("err %s %v\n", class(err), err)
				continue
			}
			fmt.Printf("ok %d\n", dst[0])
		}
	}
	// The parent closes stdin at the end; nothing is left to flush that matters.
	cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer ccancel()
	db.Close(cctx)
	s.Close(cctx)
}

// A transaction node frozen (SIGSTOP) past its etcd lease owns a cluster table's partition on
// a storage node; another node acquires the partition in etcd and registers the grant with
// the storage node; the first resumes: its writes and its cached reads fail at once, and
// nothing it wrote after the takeover is in the store; a batch under its old epoch is fenced
// by the storage node itself.
func TestFrozenTxnodeFenced(t *testing.T) {
	testkit.SkipUnderRace(t, "a freeze suite (child processes)")
	ctx := testCtx(t)
	etcd := etcdtest.Start(t)
	c := connect(t, etcd.Endpoints())
	v := cluster.NewGrantVerifier(c, storenode.ErrFenced)
	srv, err := server.New(server.Config{Listen: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler),
		Options: storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone, GrantVerifier: v}})
	require.NoError(t, err)
	require.NoError(t, srv.Start())
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	addr := srv.Addr().String()
	_, err = c.CreateTable(ctx, "acct", cluster.Layout{Partitions: 1, StripePages: 1}, []string{addr})
	require.NoError(t, err)
	ti, err := srv.Engine().CreateClusterTable(base.PartitionTableName("acct", 0), 64, base.ClusterLayout{Partitions: 1, StripePages: 1})
	require.NoError(t, err)

	child := proctest.Start(t, proctest.Spec{Name: "frozen transaction node", Test: "TestHelperFrozenTxnode",
		Env: []string{helperEnv + "=" + etcd.Endpoints()[0] + "|" + addr}, Ready: "ready"})
	send := func(line string) string {
		t.Helper()
		return child.Ask(ctx, line)
	}
	h, ok, err := c.Owner(ctx, "acct", 0)
	require.NoError(t, err)
	require.True(t, ok)
	require.EqualValues(t, childOwner, h.Owner)
	oldEpoch := h.Epoch
	var id1 uint64
	_, err = fmt.Sscanf(send("insert 1"), "ok %d", &id1)
	require.NoError(t, err)
	require.Equal(t, "ok 1", send(fmt.Sprintf("get %d", id1)), "a cached read while the grant holds")
	// A commit left unflushed in the frozen node's cache: its batch goes out only after the
	// takeover, under the old epoch.
	var id7 uint64
	_, err = fmt.Sscanf(send("winsert 7"), "ok %d", &id7)
	require.NoError(t, err)

	child.Stop()
	// Another node takes over: AcquireWait waits out the frozen node's lease, then the
	// transaction node registers the new grant with the storage node before it writes.
	sb := newSession(t, c, takerOwner, cluster.TTLMin)
	db2, err := txncoord.Open(ctx, txnode.Options{StoreAddr: addr, OwnerID: takerOwner,
		Logger: slog.New(slog.DiscardHandler)}, &cluster.TxGrants{Session: sb, Wait: true})
	require.NoError(t, err)
	defer db2.Close(context.Background())
	tb2, err := db2.Table(ctx, base.PartitionTableName("acct", 0))
	require.NoError(t, err)
	id2, err := tb2.Insert(ctx, row(2))
	require.NoError(t, err)
	h2, _, err := c.Owner(ctx, "acct", 0)
	require.NoError(t, err)
	require.Greater(t, h2.Epoch, oldEpoch)

	// The storage node fences the old grant itself: a batch of the frozen node's epoch.
	_, err = srv.Engine().CommitWait(&base.Batch{Owner: childOwner, Seq: 1 << 40,
		Fences:   []base.Fence{{Table: ti.ID, Epoch: oldEpoch}},
		Segments: []base.Segment{oneRow(ti.ID, id1, row(66))}})
	require.ErrorIs(t, err, storenode.ErrFenced)

	child.Cont()
	// Each failure must be for want of the grant: the store's fence (fenced) or the node's own
	// lease check (expired), not any error (a dropped connection would do).
	refused := func(what, r string) {
		t.Helper()
		f := strings.Fields(r)
		require.True(t, len(f) >= 2 && f[0] == "err" && (f[1] == "fenced" || f[1] == "expired"), "%s: %s", what, r)
	}
	r := send("flush")
	refused("a resumed owner flushed a batch of the old grant", r)
	t.Logf("resumed owner's flush: %s", r)
	for i := range 3 {
		r := send(fmt.Sprintf("insert %d", 10+i))
		refused("a resumed owner wrote", r)
		t.Logf("resumed owner's insert: %s", r)
		refused("a resumed owner served a cached read", send(fmt.Sprintf("get %d", id1)))
	}
	got := storedRows(t, srv.Engine(), ti.ID)
	require.Equal(t, map[uint64]uint64{id1: 1, id2: 2}, got, "only the rows of each node's own grant are stored")
	require.NotContains(t, got, id7)
}
