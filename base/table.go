package base

import "strconv"

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
