package txnode

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPageTableModel(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	pt := newPageTable()
	model := map[uint64]int32{}
	for i := range 200_000 {
		key := uint64(rng.IntN(5000)+1) | uint64(rng.IntN(3)+1)<<32
		if _, ok := model[key]; ok && rng.IntN(2) == 0 {
			pt.remove(key)
			delete(model, key)
		} else if !ok {
			pt.insert(key, int32(i), nil, nil)
			model[key] = int32(i)
		}
		if i%1000 == 0 {
			for k, v := range model {
				require.Equal(t, v, pt.lookup(k))
			}
		}
		probe := uint64(rng.IntN(5000)+1) | uint64(rng.IntN(3)+1)<<32
		want, ok := model[probe]
		if !ok {
			want = -1
		}
		require.Equal(t, want, pt.lookup(probe))
	}
}
