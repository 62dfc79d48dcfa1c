//go:build !race

package storenode

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/logicpage"
)

// The commit path hashes every batch for the dedup window: that allocates nothing.
func TestBatchHashAllocs(t *testing.T) {
	rows := make([]byte, 10*64)
	b := &Batch{Owner: 1, Seq: 2, Fences: []Fence{{1, 2}}, Segments: []Segment{
		{Table: 1, Segment: logicpage.Segment{Data: 1023, Rows: rows}}, {Table: 1, Segment: logicpage.Segment{Page: 1, Clear: 1}}}}
	require.Zero(t, testing.AllocsPerRun(100, func() { batchHash(b) }))
}
