//go:build unix && !linux

package proctest

import (
	"context"
	"errors"
	"fmt"
	"syscall"
)

// sysProcAttr: no parent-death signal outside Linux; the cleanup and ChildInput's EOF end
// the children.
func sysProcAttr() *syscall.SysProcAttr { return nil }

func waitStopped(context.Context, int) error {
	return fmt.Errorf("proctest: Freeze needs Linux's /proc: %w", errors.ErrUnsupported)
}

func writeStdout(int, []byte) error {
	return fmt.Errorf("proctest: Freeze needs Linux's /proc: %w", errors.ErrUnsupported)
}
