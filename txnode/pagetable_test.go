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
			// Compared first, required on a mismatch: require.Equal on each of the model's
			// 10,000-odd keys, 200 times over, was the test's time (seconds under -race).
			for k, v := range model {
				if got := pt.lookup(k); got != v {
					require.Equal(t, v, got, "key %x", k)
				}
			}
		}
		probe := uint64(rng.IntN(5000)+1) | uint64(rng.IntN(3)+1)<<32
		want, ok := model[probe]
		if !ok {
			want = -1
		}
		if got := pt.lookup(probe); got != want {
			require.Equal(t, want, got, "probe %x", probe)
		}
	}
}
