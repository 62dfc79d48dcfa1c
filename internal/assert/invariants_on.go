//go:build race || weft_invariants

package assert

// Invariants turns on the expensive self-checks (whole-structure verify functions). It is on
// under -race and under the weft_invariants build tag.
const Invariants = true
