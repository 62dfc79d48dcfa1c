// Package cluster is Weft's scale-out coordination on etcd: the partition map of partitioned
// tables and the write ownership of each partition, under etcd leases, with fencing epochs
// that come from etcd. It holds no row data; etcd never sees a row. etcd is the one authority
// on the map and on who owns what; a storage node serves the partitions the map gives it and
// fences every write by grant epoch; a transaction node owns partitions under its Session
// (one lease, kept alive by the session's goroutine). Package cluster/node is the game
// server's side built on it.
//
//	<prefix>map/t/<table>        the table's Layout (partition count, stripe), written once
//	<prefix>map/p/<table>/<p>    partition p -> the storage node address serving it
//	<prefix>own/<table>/<p>      the holder of partition p: owner id, incarnation, address;
//	                             bound to the holder's lease; epoch = its CreateRevision
//	<prefix>move/<table>/<p>     a partition move in progress
//
//	partition(id) = (id / 64 / StripePages) % Partitions      (Layout.Of)
//
// Rules:
//
//   - Only this package writes under its prefix. Values are versioned and CRC32C-checked
//     (values.go). txnode and storenode do not import this package: a game server that does
//     not links neither etcd's client nor grpc (.ci/run checks it).
//   - A row's partition follows from its id alone; the 64 rows of a page share a partition;
//     the layout is fixed at CreateTable.
//   - CreateTable and DropTable are one etcd transaction each. A partition changes storage
//     node only by SwitchPartition or SwitchMoved, compare-and-set on the entry's revision and
//     the table's creation revision. SwitchMoved keeps the owner key: ownership never
//     changes hands at a switch.
//   - A MapWatcher snapshot may be stale: that misroutes, never corrupts (the storage node is
//     the authority on what it serves).
//   - At most one owner key per partition exists at a time; its epoch is unique and higher
//     than every earlier grant's of the partition.
//   - Check returns nil only before the deadline (the start of the last keepalive answered
//     with the lease alive, plus the TTL, minus a margin, on the session's Clock), only for
//     a grant not known lost. After a lapse the deadline moves only once a keepalive proved
//     the lease alive and a linearizable read found every owner key still the grant's.
//   - A lost ownership never comes back; the next grant is a new Acquire with a new epoch.
//     An Acquire again adopts a key of the session's own lease, except a released one.
//   - Release and Close stop vouching before they delete anything in etcd.
//
// Reasons, failure cases and the full design: docs/cluster.md.
package cluster
