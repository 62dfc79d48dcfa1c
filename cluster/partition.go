package cluster

import (
	"fmt"
	"math/bits"
)

// RowsPerPage is the rows of one logical page (DESIGN.md): a page never spans partitions.
const RowsPerPage = 64

// Bounds of a Layout.
const (
	// PartitionsMax bounds a table's partition count.
	PartitionsMax = 1 << 16
	// StripePagesMax bounds a stripe: 2^20 pages of 64 rows, 2^26 rows.
	StripePagesMax = 1 << 20
)

// Layout is how a partitioned table's row ids map onto its partitions. It is fixed when the
// table is created.
//
// The partition function: row id i lives in logical page i/64; pages are dealt out to the
// partitions in stripes of StripePages consecutive pages, round robin:
//
//	partition(i) = (i / 64 / StripePages) % Partitions
//
// So a row's partition follows from its id alone (no lookup), every row of a logical page is
// in the page's partition, and any Partitions*StripePages*64 consecutive ids hold exactly
// StripePages*64 ids of each partition (ids spread evenly whatever the insert pattern).
type Layout struct {
	// Partitions is the partition count, 1..PartitionsMax.
	Partitions uint32
	// StripePages is the pages of a stripe, 1..StripePagesMax. 1 spreads ids most finely;
	// larger stripes keep longer runs of ids (scans, read-ahead) on one storage node.
	StripePages uint32
}

// Validate reports whether l is a usable layout (ErrInvalid otherwise).
func (l Layout) Validate() error {
	if l.Partitions == 0 || l.Partitions > PartitionsMax {
		return fmt.Errorf("%w: %d partitions (1..%d)", ErrInvalid, l.Partitions, PartitionsMax)
	}
	if l.StripePages == 0 || l.StripePages > StripePagesMax {
		return fmt.Errorf("%w: stripe of %d pages (1..%d)", ErrInvalid, l.StripePages, StripePagesMax)
	}
	return nil
}

// StripeRows is the ids of one stripe.
func (l Layout) StripeRows() uint64 { return uint64(l.StripePages) * RowsPerPage }

// Of returns the partition of row id. l must be valid. No allocation; any goroutine.
func (l Layout) Of(id uint64) uint32 {
	return uint32(id / RowsPerPage / uint64(l.StripePages) % uint64(l.Partitions))
}

// OfPage returns the partition of logical page page (the partition of each of its rows).
func (l Layout) OfPage(page uint64) uint32 {
	return uint32(page / uint64(l.StripePages) % uint64(l.Partitions))
}

// Next returns the smallest id >= id in partition part, and false when there is none below
// 2^64 (or part is out of range). An id allocator for the partitions a node owns walks them
// with it; so does a scan of one partition.
func (l Layout) Next(id uint64, part uint32) (uint64, bool) {
	if part >= l.Partitions {
		return 0, false
	}
	// A round (every partition's stripe once) is at most 2^16 * 2^26 ids: no overflow.
	stripe := l.StripeRows()
	round := stripe * uint64(l.Partitions)
	base := id - id%round // the round's first id
	// The last round below 2^64 may be partial: a stripe's start past 2^64 does not exist.
	start, carry := bits.Add64(base, uint64(part)*stripe, 0)
	switch {
	case carry != 0:
		return 0, false
	case id < start:
		return start, true
	case id-start < stripe:
		return id, true
	}
	// Past this round's stripe: the next round's.
	next, carry := bits.Add64(start, round, 0)
	if carry != 0 {
		return 0, false
	}
	return next, true
}
