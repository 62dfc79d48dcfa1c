package cluster

import (
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/storenode"
)

// The storage node keeps its own copy of the partition function (base.ClusterLayout: it
// does not import this package); both agree on every id, and storenode.PartitionNextID is Layout.Next
// bounded by the storage node's id space.
func TestPropLayoutStorenodeAgrees(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		l := genLayout(t)
		if rapid.Bool().Draw(t, "wide") {
			l.Partitions = rapid.Uint32Range(1, PartitionsMax).Draw(t, "partitions wide")
			l.StripePages = rapid.Uint32Range(1, StripePagesMax).Draw(t, "stripe wide")
		}
		part := rapid.Uint32Range(0, l.Partitions-1).Draw(t, "part")
		sl := base.ClusterLayout{Partitions: l.Partitions, StripePages: l.StripePages, Partition: part}
		require.NoError(t, sl.Validate())
		id := rapid.Uint64Range(0, storenode.MaxRowID+1<<30).Draw(t, "id")
		require.Equal(t, l.Of(id), sl.PartitionOf(id))
		require.Equal(t, l.OfPage(id/64), sl.PartitionOfPage(id/64))
		want, ok := l.Next(id, part)
		if ok && want >= storenode.MaxRowID {
			ok = false
		}
		got, gotOK := storenode.PartitionNextID(sl, id)
		require.Equal(t, ok, gotOK, "id %d", id)
		if ok {
			require.Equal(t, want, got, "id %d", id)
		}
	})
	require.Equal(t, uint32(PartitionsMax), uint32(base.ClusterPartitionsMax))
	require.Equal(t, uint32(StripePagesMax), uint32(base.ClusterStripePagesMax))
}
