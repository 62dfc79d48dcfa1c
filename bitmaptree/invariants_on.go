//go:build race || bitmaptree_invariants

package bitmaptree

// invariants turns on the expensive self-checks (a full verify after every load). It is on
// under -race and under the bitmaptree_invariants build tag.
const invariants = true
