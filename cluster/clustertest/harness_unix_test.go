//go:build unix

package clustertest_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster/clustertest"
	"github.com/weftdb/weft/internal/testkit"
)

// The harness's own checks: a storage node killed with -9 and restarted serves its rows again
// on the same address; a stopped one serves again once continued.
func TestHarnessStorageNodeRestart(t *testing.T) {
	testkit.SkipUnderRace(t, "a kill suite (child processes)")
	ctx := testCtx(t, 90*time.Second)
	c := clustertest.Start(t, clustertest.Options{StorageNodes: 1})
	ids := createRows(t, c, "t", 1, 3, 7)
	s := c.Storage[0]
	for round := range 3 {
		s.Kill()
		restartStorage(t, s)
		r, err := c.OpenNode(uint64(0x100+round), "").OpenTable(ctx, "t")
		require.NoError(t, err, "round %d", round)
		for _, id := range ids {
			require.EqualValues(t, 7, readU64(t, ctx, r, id))
		}
	}
	s.Stop()
	s.Cont()
	r, err := c.OpenNode(0x200, "").OpenTable(ctx, "t")
	require.NoError(t, err)
	require.EqualValues(t, 7, readU64(t, ctx, r, ids[0]))
}
