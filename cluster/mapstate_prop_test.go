package cluster

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// The watcher's copy is built by applying events to a mapState; a fresh read builds one from
// the keys etcd holds. Whatever the sequence of puts (good values and junk) and deletes, the
// two agree: the copy never keeps a table broken, or an entry, that etcd no longer has.
func TestPropMapStateEventsMatchFreshRead(t *testing.T) {
	k := keys{prefix: "/p/"}
	rapid.Check(t, func(t *rapid.T) {
		etcd := make(map[string][]byte) // key -> value
		created := make(map[string]int64)
		mod := make(map[string]int64)
		var st mapState
		st.init()
		rev := int64(0)
		steps := rapid.IntRange(1, 60).Draw(t, "steps")
		for i := 0; i < steps; i++ {
			rev++
			table := fmt.Sprintf("t%d", rapid.IntRange(0, 1).Draw(t, "table"))
			var key string
			var val []byte
			if rapid.Bool().Draw(t, "tableKey") {
				key = k.table(table)
				val = encodeTable(Layout{Partitions: uint32(rapid.IntRange(1, 3).Draw(t, "parts")), StripePages: 1})
			} else {
				key = k.part(table, uint32(rapid.IntRange(0, 3).Draw(t, "part")))
				val = encodePartition(fmt.Sprintf("n%d:1", rapid.IntRange(0, 2).Draw(t, "node")))
			}
			if rapid.IntRange(0, 3).Draw(t, "junk") == 0 {
				val = []byte("junk")
			}
			if rapid.IntRange(0, 3).Draw(t, "del") == 0 {
				if _, ok := etcd[key]; ok {
					delete(etcd, key)
					delete(created, key)
					delete(mod, key)
					st.del(k, key)
				}
				continue
			}
			if _, ok := etcd[key]; !ok {
				created[key] = rev
			}
			etcd[key], mod[key] = val, rev
			st.put(k, key, val, created[key], rev)
		}
		var fresh mapState
		fresh.init()
		for _, key := range slices.Sorted(maps.Keys(etcd)) {
			fresh.put(k, key, etcd[key], created[key], mod[key])
		}
		got, want := st.snapshot(rev), fresh.snapshot(rev)
		require.Equal(t, want.Tables, got.Tables)
		require.Equal(t, slices.Sorted(maps.Keys(want.Broken)), slices.Sorted(maps.Keys(got.Broken)))
	})
}
