//go:build !race

package txnode

import (
	"context"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestViewAllocs: a cache-hit View allocates nothing, with a closure that captures the
// caller's variables (it does not escape), in both durability modes.
func TestViewAllocs(t *testing.T) {
	ctx := context.Background()
	for _, mode := range []Durability{Durable, WriteBack} {
		_, tb, ids := allocSetup(t, Options{Dir: t.TempDir(), SyncMode: "none", Durability: mode})
		for _, id := range ids {
			require.NoError(t, tb.View(ctx, id, func([]byte) error { return nil })) // warm
		}
		n, sum := 0, uint64(0)
		allocs := testing.AllocsPerRun(1000, func() {
			n++
			err := tb.View(ctx, ids[n%len(ids)], func(row []byte) error {
				sum += binary.LittleEndian.Uint64(row)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
		require.Zero(t, allocs, "Table.View, mode %v", mode)
		require.NotZero(t, sum)
	}
}
