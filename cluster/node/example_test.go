package node_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/etcdtest"
	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/storenode/server"
)

// Example runs a small cluster in-process (a real etcd, two storage nodes verifying grants
// in etcd, as `storenode -etcd` does) and two game servers: each owns half the partitions of
// a table, moves money between its accounts on one storage node in one transaction, reads
// the other's rows (durable rows), and is refused a write to them with the holder's address.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	quiet := slog.New(slog.DiscardHandler)
	dir, _ := os.MkdirTemp("", "weft-example")
	defer os.RemoveAll(dir)
	etcd, err := etcdtest.New(dir + "/etcd")
	if err != nil {
		panic(err)
	}
	defer etcd.Close()
	etcdCfg := cluster.Config{Endpoints: etcd.Endpoints(), Prefix: "/example/", Logger: quiet}
	verifier, err := cluster.Connect(ctx, etcdCfg)
	if err != nil {
		panic(err)
	}
	defer verifier.Close()
	var storageNodes []string
	for i := range 2 {
		srv, err := server.New(server.Config{Listen: "127.0.0.1:0", Logger: quiet, Options: storenode.Options{
			Dir: fmt.Sprintf("%s/sn%d", dir, i), Sync: storenode.SyncNone,
			GrantVerifier: cluster.NewGrantVerifier(verifier, storenode.ErrFenced)}})
		if err != nil {
			panic(err)
		}
		if err := srv.Start(); err != nil {
			panic(err)
		}
		defer srv.Shutdown(context.Background())
		storageNodes = append(storageNodes, srv.Addr().String())
	}

	open := func(owner uint64, addr string) *node.Node {
		n, err := node.Open(ctx, node.Config{Etcd: etcdCfg, Logger: quiet,
			Session: cluster.SessionConfig{Owner: owner, Addr: addr}})
		if err != nil {
			panic(err)
		}
		return n
	}
	zoneA, zoneB := open(1, "zone-a:7000"), open(2, "zone-b:7000")
	defer zoneB.Close(ctx)
	defer zoneA.Close(ctx)

	// 4 partitions: 0 and 2 on the first storage node, 1 and 3 on the second.
	acctA, err := zoneA.CreateTable(ctx, "acct", 64, 4, 1, storageNodes)
	if err != nil {
		panic(err)
	}
	acctB, err := zoneB.OpenTable(ctx, "acct")
	if err != nil {
		panic(err)
	}
	must(acctA.Own(ctx, 0, 2)) // zone A's partitions: both on the first storage node
	must(acctB.Own(ctx, 1, 3))

	row := func(v byte) []byte { r := make([]byte, 64); r[0] = v; return r }
	alice, err := acctA.Insert(ctx, row(100)) // round robin over partitions 0 and 2
	must(err)
	bob, err := acctA.Insert(ctx, row(100)) // the other one
	must(err)
	carol, err := acctB.Insert(ctx, row(100))
	must(err)

	// One transaction over two partitions of one storage node: one commit batch.
	must(zoneA.Update(ctx, func(tx *node.Tx) error {
		a, b := make([]byte, 64), make([]byte, 64)
		if err := tx.Get(acctA, alice, a); err != nil {
			return err
		}
		if err := tx.Get(acctA, bob, b); err != nil {
			return err
		}
		a[0], b[0] = a[0]-30, b[0]+30
		if err := tx.Put(acctA, alice, a); err != nil {
			return err
		}
		return tx.Put(acctA, bob, b)
	}))

	got := make([]byte, 64)
	must(acctB.Get(ctx, bob, got)) // zone B reads zone A's row: durable rows
	fmt.Println("bob, as zone B reads it:", got[0])

	err = acctA.Put(ctx, carol, row(0))
	var notOwner *node.NotOwnerError
	if errors.As(err, &notOwner) {
		fmt.Println("write carol from zone A: route to", notOwner.Holder.Addr)
	}
	err = zoneA.Update(ctx, func(tx *node.Tx) error {
		return tx.Put(acctA, carol, row(0))
	})
	fmt.Println("transaction on carol from zone A:", errors.Is(err, node.ErrNotOwner))
	// Output:
	// bob, as zone B reads it: 130
	// write carol from zone A: route to zone-b:7000
	// transaction on carol from zone A: true
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}
