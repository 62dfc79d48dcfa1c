//go:build linux

package proctest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
	"time"
)

// sysProcAttr makes the kernel kill the child when the parent dies (it may not run its
// cleanups: a -test.timeout panic).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// waitStopped waits until every thread of process pid is stopped (state T or t in
// /proc/PID/task/*/stat): a SIGSTOP's group stop is complete, no thread of it runs (nor
// writes) any more. It polls every millisecond, within ctx.
func waitStopped(ctx context.Context, pid int) error {
	for {
		done, err := allStopped(pid)
		if err != nil || done {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond): // a condition polled within ctx
		}
	}
}

func allStopped(pid int) (bool, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return false, err
	}
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue // the thread exited
			}
			return false, err
		}
		// pid (comm) state ...: comm may hold spaces and parentheses, the state follows the
		// last ')'.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) {
			return false, fmt.Errorf("proctest: /proc/%d/task/%s/stat: %q", pid, task.Name(), b)
		}
		if s := b[i+2]; s != 'T' && s != 't' {
			return false, nil
		}
	}
	return true, nil
}

// writeStdout writes b to process pid's stdout (its pipe, opened anew through /proc).
func writeStdout(pid int, b []byte) error {
	f, err := os.OpenFile(fmt.Sprintf("/proc/%d/fd/1", pid), os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
