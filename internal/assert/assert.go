// Package assert checks programmer errors: a broken invariant panics with a message, so it is
// found at the line that broke it rather than as corrupt data later. Operating errors (bad
// input, IO failures) are returned as errors, never asserted.
package assert

import "fmt"

// That panics with the formatted message when cond is false.
func That(cond bool, format string, args ...any) {
	if !cond {
		panic(fmt.Sprintf("weft: invariant violated: "+format, args...))
	}
}
