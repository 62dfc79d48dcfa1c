// Package procinfo tells which process holds a resource this one was refused: the flock on a
// store's lock file, a TCP port in listen. It reads what the operating system publishes
// (Linux's /proc); where it cannot tell, it says nothing, and the caller's error stays as it was.
//
// Only refusal paths call it: each call reads a few /proc files (a port's holder scans the
// descriptors of the processes this user may read), never on a request's path.
package procinfo

import "fmt"

// Process is a process that holds something, as the operating system names it.
type Process struct {
	PID  int
	Name string // its command name (comm), "" when unreadable
}

// String prints "process 1234 (storenode)".
func (p Process) String() string {
	if p.Name == "" {
		return fmt.Sprintf("process %d", p.PID)
	}
	return fmt.Sprintf("process %d (%s)", p.PID, p.Name)
}

// HeldBy returns ": held by process 1234 (storenode)" for an error message, or "" when the
// holder is unknown (ok false).
func HeldBy(p Process, ok bool) string {
	if !ok {
		return ""
	}
	return ": held by " + p.String()
}
