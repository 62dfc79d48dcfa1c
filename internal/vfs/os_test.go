package vfs

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// lockChildEnv names the file TestDefaultLockChild tries to lock, when the test binary runs as
// the child of TestDefaultLockAcrossProcesses.
const lockChildEnv = "WEFT_VFS_LOCK_CHILD"

// Exit codes of the lock child.
const (
	lockChildGot    = 0
	lockChildLocked = 3
	lockChildFailed = 4
)

func TestDefaultLockChild(t *testing.T) {
	name := os.Getenv(lockChildEnv)
	if name == "" {
		t.Skip("runs only as the child of TestDefaultLockAcrossProcesses")
	}
	l, err := Default.Lock(name)
	switch {
	case err == nil:
		_ = l.Close()
		os.Exit(lockChildGot)
	case errors.Is(err, ErrLocked) && errors.Is(err, syscall.EWOULDBLOCK):
		os.Exit(lockChildLocked)
	default:
		os.Exit(lockChildFailed)
	}
}

func TestDefaultLockAcrossProcesses(t *testing.T) {
	name := filepath.Join(t.TempDir(), "LOCK")
	runChild := func() int {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestDefaultLockChild$")
		cmd.Env = append(os.Environ(), lockChildEnv+"="+name)
		err := cmd.Run()
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			return exitErr.ExitCode()
		}
		require.NoError(t, err)
		return 0
	}
	l, err := Default.Lock(name)
	require.NoError(t, err)
	require.Equal(t, lockChildLocked, runChild(), "another process is refused while we hold it")
	require.NoError(t, l.Close())
	require.Equal(t, lockChildGot, runChild(), "and gets it once we release it")
}
