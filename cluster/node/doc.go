// Package node is a game server's view of a Weft cluster: partitioned tables over several
// storage nodes, the partition map and ownership in etcd (package cluster), one transaction
// node (txnode.DB) per storage node it talks to. A row's partition is cluster.Layout.Of(id);
// the partition map says its storage node. Tables follow the map (follow.go), transactions
// over several storage nodes commit in two phases (coord.go), and a storage node's dead
// transaction node is replaced on its next use (heal.go).
//
// Rules:
//
//   - A partition this node owns is served by its storage node's transaction node under the
//     partition's etcd grant (txncoord.Grants): cached reads, writes, id allocation.
//     Any other partition is read from durable rows (possibly older than the owner's cache)
//     and written nowhere: a write fails with a *NotOwnerError naming the holder
//     (ErrNotOwner).
//   - Inserts go round robin over the owned partitions; each partition's ids come from its
//     storage node, which hands out only ids of its stripes.
//   - A move's switch keeps the owner key: after a move this node reads the new storage node
//     and, if it owned the partition, owns it there under the same grant. Writes refused
//     during a move fail with a *NotOwnerError (retry them); cached reads stay correct. A
//     dropped table's handle fails with cluster.ErrTableNotFound.
//   - Node.Update is atomic and serializable over owned partitions on any storage nodes; fn
//     runs once per attempt. It returns nil only once the primary recorded commit, and
//     txnode.ErrUnknownOutcome when the answer was not learned before ctx ended (finished
//     in the background until Close, and by the storage nodes' resolvers anyway). An abort
//     the primary did not answer is recorded in the background (bounded).
//   - Node.View validates each storage node's reads after fn: serializable across storage
//     nodes. Inside Update or View a read of a partition not owned fails with ErrNotOwner.
//   - Own and OwnWait take partitions under the node's session (one etcd lease); Close
//     releases them; a node that dies loses them one TTL after its last keepalive. A grant
//     lost while the node runs (session ended, storenode.ErrFenced) makes writes fail with a
//     *NotOwnerError naming the new holder. Released (Table.Release) or lost, a partition may
//     be owned again by the same node (a new grant; its transaction node forgot the old
//     table state: txncoord.Forget), as after a move away and back; a session that
//     ended grants nothing more (reopen the node).
//   - Healing keeps the etcd grants and reopens every Table's handles; commits not
//     acknowledged when the old transaction node died failed (txnode.ErrUnknownOutcome);
//     nothing acknowledged is lost in Durable mode (WriteBack loses the unflushed ones).
//   - txnode and storenode do not import this package or package cluster.
//
// Reasons, history and the full design: docs/cluster.md, "The cluster node" and "What the
// coordinator must do".
package node
