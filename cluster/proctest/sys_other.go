//go:build unix && !linux

package proctest

import "syscall"

// sysProcAttr: no parent-death signal outside Linux; the cleanup and ChildInput's EOF end
// the children.
func sysProcAttr() *syscall.SysProcAttr { return nil }
