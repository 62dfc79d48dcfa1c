package testkit

import (
	"bytes"
	"runtime"
)

// GoroutinesIn counts the goroutines whose stack has fn (a function's qualified name, or any
// part of a stack line): for a goroutine parked inside a package, which no channel reports.
// Every goroutine's stack is read, however many there are.
func GoroutinesIn(fn string) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return bytes.Count(buf[:n], []byte(fn))
		}
		buf = make([]byte, 2*len(buf))
	}
}
