package base

import (
	"errors"
	"fmt"
)

// ClusterLayout is a cluster-managed table's place in its partitioned table (docs/cluster.md):
// the partitioned table's layout (cluster.Layout: Partitions, StripePages) and the Partition
// this table holds. The zero value marks a local table.
//   - A valid layout: 1 <= Partitions <= ClusterPartitionsMax, 1 <= StripePages <=
//     ClusterStripePagesMax, Partition < Partitions.
//   - Row id id is in partition (id / RowsPerPage / StripePages) % Partitions (cluster.Layout.Of;
//     a test in package cluster checks that the two agree).
type ClusterLayout struct {
	Partitions  uint32
	StripePages uint32
	Partition   uint32
}

// Bounds of a ClusterLayout: cluster.PartitionsMax and cluster.StripePagesMax. Part of the
// formats (WAL, meta and wire); do not change.
const (
	ClusterPartitionsMax  = 1 << 16
	ClusterStripePagesMax = 1 << 20
)

// RowsPerPage is the rows of a logical page (logicpage.RowsPerPage, which checks that the two
// agree), for the partition function.
const RowsPerPage = 64

// IsCluster reports whether l marks a cluster-managed table.
func (l ClusterLayout) IsCluster() bool { return l.Partitions != 0 }

// Validate reports whether l is a usable layout: nil, or an error matching ErrMalformed that
// reads in no package's words (its caller adds its own).
func (l ClusterLayout) Validate() error {
	if l.Partitions == 0 || l.Partitions > ClusterPartitionsMax || l.StripePages == 0 ||
		l.StripePages > ClusterStripePagesMax || l.Partition >= l.Partitions {
		return layoutError{l}
	}
	return nil
}

// layoutError is Validate's error: ErrMalformed under errors.Is (and so every twin of it).
type layoutError struct{ l ClusterLayout }

func (e layoutError) Error() string {
	return fmt.Sprintf("malformed cluster layout of %d partitions, stripes of %d pages, partition %d",
		e.l.Partitions, e.l.StripePages, e.l.Partition)
}

func (e layoutError) Is(target error) bool { return errors.Is(ErrMalformed, target) }

// PartitionOf is the partition of row id. l must be valid.
func (l ClusterLayout) PartitionOf(id uint64) uint32 { return l.PartitionOfPage(id / RowsPerPage) }

// PartitionOfPage is the partition of every row of logical page page. l must be valid.
func (l ClusterLayout) PartitionOfPage(page uint64) uint32 {
	return uint32(page / uint64(l.StripePages) % uint64(l.Partitions))
}
