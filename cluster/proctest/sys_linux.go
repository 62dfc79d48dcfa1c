//go:build linux

package proctest

import "syscall"

// sysProcAttr makes the kernel kill the child when the parent dies (it may not run its
// cleanups: a -test.timeout panic).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
