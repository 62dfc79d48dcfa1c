package vfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
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
	// lockChildUnnamed: refused, but (on Linux) the error does not name the parent as holder.
	lockChildUnnamed = 5
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
	case errors.Is(err, ErrLocked) && isLocked(err) && !errors.Is(err, ErrLockedInProcess):
		if runtime.GOOS == "linux" && !strings.Contains(err.Error(), fmt.Sprintf(": held by process %d ", os.Getppid())) {
			os.Exit(lockChildUnnamed)
		}
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
	require.Equal(t, lockChildLocked, runChild(), "another process is refused while we hold it, told by whom (Linux)")
	require.NoError(t, l.Close())
	require.Equal(t, lockChildGot, runChild(), "and gets it once we release it")
}

// TestDefaultLockInProcess: a second Lock of a file this process holds, by another spelling
// of its path or another name of the file, says so (ErrLockedInProcess, still ErrLocked), never "another holder"; closing
// frees it for this process at once.
func TestDefaultLockInProcess(t *testing.T) {
	dir := t.TempDir()
	name := filepath.Join(dir, "LOCK")
	l, err := Default.Lock(name)
	require.NoError(t, err)
	sep := string(filepath.Separator)
	_, err = Default.Lock(dir + sep + "." + sep + "LOCK")
	require.ErrorIs(t, err, ErrLockedInProcess)
	require.ErrorIs(t, err, ErrLocked)
	require.NotContains(t, err.Error(), "another")
	require.Contains(t, err.Error(), "this process")
	link := filepath.Join(dir, "LINK")
	require.NoError(t, os.Link(name, link))
	_, err = Default.Lock(link)
	require.ErrorIs(t, err, ErrLockedInProcess, "the same file by another name")
	require.NoError(t, l.Close())
	l2, err := Default.Lock(name)
	require.NoError(t, err, "free again once closed")
	require.NoError(t, l2.Close())
	require.Error(t, l2.Close(), "a second Close")
	l3, err := Default.Lock(name)
	require.NoError(t, err, "a second Close releases nobody else's lock")
	require.NoError(t, l3.Close())
}

// TestDefaultLockInProcessConcurrent: goroutines racing to Lock and Close one file see it
// held by at most one of them at a time, and every refusal says "this process": a lock closed
// just now is never mistaken for another process's (Close and Lock are ordered by lockMu).
func TestDefaultLockInProcessConcurrent(t *testing.T) {
	name := filepath.Join(t.TempDir(), "LOCK")
	rounds := 2000
	if testing.Short() {
		rounds = 200
	}
	var holders atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				l, err := Default.Lock(name)
				if err != nil {
					if !errors.Is(err, ErrLockedInProcess) {
						errs <- err
						return
					}
					continue
				}
				if n := holders.Add(1); n != 1 {
					errs <- fmt.Errorf("%d holders at once", n)
				}
				holders.Add(-1)
				if err := l.Close(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}
