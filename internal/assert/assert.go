// Package assert checks programmer errors: a broken invariant panics with a message, so it is
// found at the line that broke it rather than as corrupt data later. Operating errors (bad
// input, IO failures) are returned as errors, never asserted.
//
// Assertions sit on hot paths, so a holding condition costs a compare and nothing else: That
// takes a constant message and no arguments (variadic arguments would be boxed, and allocate,
// on every call); a message with values is formatted by Failf behind the failed branch:
//
//	if got != want {
//		assert.Failf("pkg: got %d, want %d", got, want)
//	}
//
// Invariants says whether the module was built with its expensive self-checks on (the
// weft_invariants build tag, or -race): verify functions that walk a whole structure run after
// every step of the model tests then, and never in a production build.
package assert

import "fmt"

// That panics with msg when cond is false. It never allocates when cond holds.
func That(cond bool, msg string) {
	if !cond {
		panic("weft: invariant violated: " + msg)
	}
}

// Failf panics with the formatted message. Call it only on the branch where the invariant has
// already failed: its arguments are boxed before the call.
func Failf(format string, args ...any) {
	panic(fmt.Sprintf("weft: invariant violated: "+format, args...))
}
