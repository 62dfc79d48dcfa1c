// Package cluster is Weft's scale-out coordination on etcd: the partition map of partitioned
// tables and the write ownership of each partition, under etcd leases, with fencing epochs
// that come from etcd. It holds no row data; etcd never sees a row. docs/cluster.md is the
// full design, with how the storage node, the transaction node, the two-phase commit and the
// partition move will use this package.
//
// # Roles
//
//   - etcd (a 3-5 member cluster in production) is the one authority on the partition map
//     and on who owns which partition. Only this package writes under its prefix.
//   - A storage node serves partitions (each lives on one node, as the map says) and fences
//     every write with the epoch of the grant the writer registered with it.
//   - A transaction node (a game server embedding txnode) owns partitions for writing under
//     its Session: one etcd lease, kept alive by the session's goroutine.
//
// A game server opts in by importing this package. txnode and storenode do not import it, so
// a game server that does not links neither etcd's client nor grpc (.ci/run checks it).
// Package cluster/node is the game server's side built on it: partitioned tables over several
// storage nodes, routed by id, written where this node owns the partition.
//
// # Keys in etcd
//
//	<prefix>map/t/<table>        the table's Layout (partition count, stripe), written once
//	<prefix>map/p/<table>/<p>    partition p -> the storage node address serving it
//	<prefix>own/<table>/<p>      the holder of partition p: owner id, incarnation, address;
//	                             bound to the holder's lease; epoch = its CreateRevision
//
// The value formats (versioned, CRC32C) are in values.go and docs/cluster.md.
//
// # The partition function
//
//	partition(id) = (id / 64 / StripePages) % Partitions
//
// (Layout.Of). A row's partition follows from its id alone; the 64 rows of a logical page
// share a partition; any Partitions*StripePages*64 consecutive ids hold StripePages*64 of
// each partition. The layout is fixed at CreateTable.
//
// # The partition map
//
// CreateTable and DropTable change a table's entries in one etcd transaction each;
// SwitchPartition changes one partition's storage node by compare-and-set on that entry's
// revision (and the table's creation revision, and any extra conditions): the "switch in one
// etcd transaction" step of a move (SwitchMoved for cluster/node's moves: it keeps the owner
// key, so ownership never changes hands at a switch, and MoveFloor gives the target's grant
// floor, just below the kept grant's epoch). MapWatcher keeps a local, immutable snapshot current
// from a watch; a stale snapshot misroutes, it never corrupts: the storage node is the
// authority on what it serves.
//
// # Ownership
//
// Session.Acquire creates the owner key only where none exists (compare CreateRevision = 0)
// and binds it to the session's lease. The grant's epoch is the key's CreateRevision: etcd
// revisions only grow, so a later grant of the partition always has a higher epoch, and a
// storage node that refuses epochs below the highest it has seen fences every earlier owner.
// A session vouches for its ownerships (Check) only before its deadline: the start of its
// last keepalive that etcd answered with the lease alive, plus the TTL etcd granted, minus a
// margin, on the session's monotonic Clock. etcd restarts the TTL when a keepalive arrives,
// after its start, so the lease cannot expire, nor the partition be granted elsewhere, before
// the deadline (up to the clocks' rate difference, which the margin covers).
//
// Invariants:
//   - At most one owner key per partition exists at a time, and its epoch is unique and
//     higher than every earlier grant's of the partition.
//   - Check returns nil only before the deadline, only for a grant not known lost; after a
//     lapse the deadline moves only once a keepalive proved the lease alive and a
//     linearizable read found every owner key still the grant's (never on trust).
//   - A lost ownership never comes back; the next grant is a new Acquire with a new epoch.
//   - Release and Close stop vouching before they delete anything in etcd.
//
// # Failure cases
//
//   - The node is cut off from etcd, or paused (SIGSTOP): its deadline passes first (Check
//     compares the clock, so a resumed process is lapsed at once, before its keepalive
//     goroutine runs); etcd expires the lease after the TTL, deleting the owner keys;
//     another node's AcquireWait takes the partitions with higher epochs. Back, the node's
//     keepalive finds the lease gone: every ownership is lost (ErrLost).
//   - etcd down or restarted: sessions lapse at their deadline (ErrLapsed: no writes, no
//     acquires); etcd renews every lease when it comes back, so a keepalive and a read of
//     the owner keys prove the grants again, same epochs. Map reads fail with
//     ErrUnavailable; MapWatcher keeps its last snapshot and resumes its watch.
//   - An owner key deleted outright (DropTable, an operator): the owner-key watch loses the
//     grant; until the watch delivers, the storage nodes' fences (the next owner registers a
//     higher epoch) stop the old owner's writes.
//   - etcd compacted past a watch's revision: the watcher reads afresh (the map), or reads
//     every owner key (the session; an Acquire pending meanwhile reads its own key once
//     granted).
//   - An Acquire whose reply was lost: Acquire again; a key of the session's own lease is
//     adopted with its epoch, unless it is the key of a grant the session released (its
//     delete failed): that one is deleted and created anew, with a new epoch.
//   - Release failing (etcd unreachable): the key stays until Release succeeds or the lease
//     ends; Close revokes the lease, or it expires within the TTL.
package cluster
