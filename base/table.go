package base

import (
	"strconv"
	"time"
)

// partitionSuffix separates a partitioned table's name from the partition number in the
// name of the partition's table on a storage node. Part of the format; do not change.
const partitionSuffix = ".p"

// PartitionTableName is the name of partition p of the partitioned table table on its
// storage node: table + ".p" + p in decimal ("accounts.p3"). A storage node's names are
// 1..64 bytes of [A-Za-z0-9_.-], so a partitioned table stored on storage nodes must have a
// name of that alphabet, short enough for the suffix.
func PartitionTableName(table string, p uint32) string {
	return table + partitionSuffix + strconv.FormatUint(uint64(p), 10)
}

// Grant is a table's write ownership: Owner may commit to Table while it presents Epoch, and
// renews it (by traffic, or Acquire with its epoch) within Lease; 0 is for ever (the embedded
// store, which nobody else reaches). LastSeq is the owner's last batch seq the store applied.
type Grant struct {
	Table   uint32
	Owner   uint64
	Epoch   uint64
	Lease   time.Duration
	LastSeq uint64
}

// TableInfo describes a table as its storage node keeps it.
//   - NextID is the id high-water mark: every id below it has been granted (for a
//     cluster-managed table: every id of its partition below it); no row lives at or above it.
//   - Rows is the number of rows present, as the engine counts them (storenode.Engine, the
//     embedded store); the wire does not carry it, so a remote store's is 0.
//   - Cluster is a cluster-managed table's layout and partition; zero for a local table.
type TableInfo struct {
	ID       uint32
	Name     string
	RowBytes int
	NextID   uint64
	Rows     uint64
	Cluster  ClusterLayout
}
