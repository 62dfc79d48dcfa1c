// Package node is a game server's view of a Weft cluster (docs/cluster.md, "The cluster
// node"): partitioned tables over several storage nodes, the partition map and ownership in
// etcd (package cluster), one transaction node (txnode.DB) per storage node it talks to.
//
//	n, _ := node.Open(ctx, node.Config{Etcd: cluster.Config{Endpoints: eps},
//		Session: cluster.SessionConfig{Owner: 7, Addr: "zone-a:7000"}})
//	defer n.Close(ctx)
//	t, _ := n.CreateTable(ctx, "acct", 64, 12, 1, storageNodes) // or n.OpenTable(ctx, "acct")
//	t.Own(ctx, 0, 2, 4)                                         // write ownership, per partition
//	id, _ := t.Insert(ctx, row)                                 // into an owned partition
//	n.Update(ctx, func(tx *node.Tx) error { ... })              // rows on any storage nodes
//
// # Routing
//
// A row's partition is cluster.Layout.Of(id); the partition map says its storage node. A
// partition this node owns is served by that storage node's transaction node under the
// partition's etcd grant (txnode.Options.Grants, registered with the storage node, which
// verifies it in etcd): cached reads, writes, id allocation. A partition it does not own is
// read from the storage node's durable rows (txnode.DurableTable: possibly older than the
// owner's cache) and written nowhere: the write fails with a *NotOwnerError naming the holder's
// address (ErrNotOwner). Inserts go round robin over the owned partitions (each partition's
// ids come from its storage node, which hands out only ids of its stripes).
//
// The Tables follow the partition map (a cluster.MapWatcher): after a move, a partition is
// read from its new storage node and, if this node owned it, owned there under the same
// grant: a move's switch keeps the owner key, so ownership never changes hands at a switch
// and no other node can acquire the partition until this node releases it or its lease
// ends (the writes refused during the move fail with a *NotOwnerError: retry them; the
// cached reads stay correct throughout); a dropped table's handle fails with
// cluster.ErrTableNotFound (follow.go).
//
// # Transactions
//
// Node.Update runs a transaction over rows of owned partitions on any storage nodes,
// atomic and serializable. fn runs once per attempt; a txnode transaction is begun on each
// storage node when fn first touches a row there. One storage node: one commit batch, as on
// a single node. Several: two-phase commit (coord.go; docs/cluster.md, "What the coordinator
// must do"): every written part prepared (rows locked in this node's cache too), every part's
// reads validated with all writes locked, the session checked, the decision recorded at the
// primary (the storage node of the first part written), then applied everywhere. Update
// returns nil only once the primary recorded commit; txnode.ErrUnknownOutcome when the
// answer was not learned before ctx ended (the transaction is finished in the background
// until Close, and by the storage nodes' resolvers anyway); an aborted one whose abort the
// primary did not answer (ctx ended, its transaction node dead) has it recorded in the
// background (bounded goroutines and queue, each tried until recorded or Close), so the
// resolvers settle it at once. Node.View
// validates each storage node's reads after fn: serializable across storage nodes. A read
// of a partition this node does not own inside either fails with ErrNotOwner.
//
// # Ownership
//
// Own and OwnWait take partitions under the node's session (one etcd lease); Close releases
// them (and the other nodes take them at once); a node that dies loses them one TTL after its
// last keepalive. A grant lost while the node runs (its session ended, or the storage node
// fenced it: storenode.ErrFenced) makes writes fail with a *NotOwnerError naming the new
// holder; the node cannot own that partition again (a new
// session: reopen the node).
//
// # Healing
//
// A storage node's transaction node that died for good (txnode.DB.Err: the storage node
// stayed unreachable past RequestTimeout, or its commit pipeline failed) is replaced on the
// storage node's next use: closed keeping its etcd grants, dialled again (with backoff,
// within the caller's context), every open Table's durable handles there reopened and the
// owned partitions' grants registered again (heal.go; docs/cluster.md, "The cluster node").
// Commits not acknowledged when it died failed (txnode.ErrUnknownOutcome); nothing
// acknowledged is lost in Durable mode (WriteBack loses the acknowledged, unflushed ones).
//
// txnode and storenode do not import this package or package cluster: a game server without
// a cluster links no etcd.
package node
