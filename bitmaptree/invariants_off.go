//go:build !race && !bitmaptree_invariants

package bitmaptree

// invariants turns on the expensive self-checks; see invariants_on.go.
const invariants = false
