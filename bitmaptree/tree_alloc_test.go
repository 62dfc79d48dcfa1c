//go:build !race

package bitmaptree

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestHotPathsDoNotAllocate guards the operations the storage node runs per row or per page.
// (The race detector allocates on its own, hence the build tag.)
func TestHotPathsDoNotAllocate(t *testing.T) {
	tr := New()
	for i := uint64(0); i < 1<<16; i += 3 {
		tr.Set(i)
	}
	var sink uint64
	for name, f := range map[string]func(){
		"Test": func() {
			if tr.Test(999) {
				sink++
			}
		},
		"Set":       func() { tr.Set(1000) },
		"Clear":     func() { tr.Clear(1001) },
		"NextSet":   func() { x, _ := tr.NextSet(5000); sink += x },
		"NextClear": func() { x, _ := tr.NextClear(5000); sink += x },
		"Count":     func() { sink += tr.Count() },
		"Last":      func() { x, _ := tr.Last(); sink += x },
		"Range": func() {
			for x := range tr.Range(100, 5000) {
				sink += x
			}
		},
		"Words": func() {
			for first, w := range tr.Words(100, 5000) {
				sink += first ^ w
			}
		},
		"Word": func() { sink += tr.Word(999) },
		"All": func() {
			for x := range tr.All() {
				sink += x
			}
		},
	} {
		require.Zero(t, testing.AllocsPerRun(100, f), name)
	}
	_ = sink
}
