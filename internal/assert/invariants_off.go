//go:build !race && !weft_invariants

package assert

// Invariants turns on the expensive self-checks; see invariants_on.go.
const Invariants = false
