//go:build race || weft_invariants

package wal

// invariants turns on expensive self-checks: under -race and the weft_invariants tag.
const invariants = true
