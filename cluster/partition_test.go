package cluster

import (
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func genLayout(t *rapid.T) Layout {
	return Layout{
		Partitions:  rapid.Uint32Range(1, 70).Draw(t, "partitions"),
		StripePages: rapid.Uint32Range(1, 9).Draw(t, "stripe"),
	}
}

// A row's partition is the formula's, every row of a logical page is in the page's
// partition, and ids spread evenly: any window of a round's length holds a stripe's worth of
// every partition.
func TestPropLayoutPartitionOf(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		l := genLayout(t)
		require.NoError(t, l.Validate())
		id := rapid.Uint64Range(0, 1<<36).Draw(t, "id")
		p := l.Of(id)
		require.Less(t, p, l.Partitions)
		require.Equal(t, uint32((id/64/uint64(l.StripePages))%uint64(l.Partitions)), p)
		require.Equal(t, p, l.OfPage(id/64))
		page := id / 64
		for s := uint64(0); s < 64; s++ {
			require.Equal(t, p, l.Of(page*64+s), "a page spans partitions")
		}
		round := l.StripeRows() * uint64(l.Partitions)
		if round <= 1<<14 {
			counts := make([]uint64, l.Partitions)
			for i := id; i < id+round; i++ {
				counts[l.Of(i)]++
			}
			for q, c := range counts {
				require.Equal(t, l.StripeRows(), c, "partition %d", q)
			}
		}
	})
}

// Next is the smallest id >= id of the partition: checked against a walk.
func TestPropLayoutNext(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		l := genLayout(t)
		id := rapid.Uint64Range(0, 1<<36).Draw(t, "id")
		if rapid.Bool().Draw(t, "top") { // the last, partial round below 2^64
			id = ^uint64(0) - rapid.Uint64Range(0, 1<<16).Draw(t, "below")
		}
		part := rapid.Uint32Range(0, l.Partitions).Draw(t, "part") // may be out of range
		got, ok := l.Next(id, part)
		if part >= l.Partitions {
			require.False(t, ok)
			return
		}
		// The model: walk up from id, at most a round, stopping at 2^64.
		want, found := id, false
		for n := uint64(0); n <= l.StripeRows()*uint64(l.Partitions); n++ {
			if l.Of(want) == part {
				found = true
				break
			}
			if want == ^uint64(0) {
				break
			}
			want++
		}
		require.Equal(t, found, ok, "id %d part %d", id, part)
		if found {
			require.Equal(t, want, got)
		}
	})
}

func TestLayoutBounds(t *testing.T) {
	for _, l := range []Layout{{0, 1}, {1, 0}, {PartitionsMax + 1, 1}, {1, StripePagesMax + 1}} {
		require.ErrorIs(t, l.Validate(), ErrInvalid, "%+v", l)
	}
	l := Layout{Partitions: PartitionsMax, StripePages: StripePagesMax}
	require.NoError(t, l.Validate())
	// The largest layout: the last id below 2^64 still has a partition and a Next.
	top := ^uint64(0)
	p := l.Of(top)
	n, ok := l.Next(top, p)
	require.True(t, ok)
	require.Equal(t, top, n)
	_, ok = l.Next(top, (p+1)%PartitionsMax)
	if p+1 < PartitionsMax {
		require.False(t, ok, "no id of a later stripe is left below 2^64")
	}
}

func TestLayoutOfAllocs(t *testing.T) {
	l := Layout{Partitions: 12, StripePages: 4}
	var sink uint32
	require.Zero(t, testing.AllocsPerRun(100, func() { sink += l.Of(12345) }))
	_ = sink
}
