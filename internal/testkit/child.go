package testkit

import (
	"io"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Child is a started child process the test kills with SIGKILL (a crash test's writer).
type Child struct {
	// Stdout is the child's standard output, to read until it ends.
	Stdout io.Reader
	// Stderr holds the child's standard error; read it after cmd.Wait.
	Stderr *strings.Builder
	// Kill sends the child SIGKILL, once however often it is called.
	Kill    func()
	timeout *time.Timer
}

// StartChild starts cmd with its output piped to the returned Child and kills it after
// within. The caller defers Stop: a failed check must not leave the child running.
func StartChild(t testing.TB, cmd *exec.Cmd, within time.Duration) *Child {
	t.Helper()
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	stderr := new(strings.Builder)
	cmd.Stderr = stderr
	require.NoError(t, cmd.Start())
	kill := sync.OnceFunc(func() { _ = cmd.Process.Signal(syscall.SIGKILL) })
	return &Child{Stdout: stdout, Stderr: stderr, Kill: kill, timeout: time.AfterFunc(within, kill)}
}

// Stop stops the child's timeout and kills it if it still runs.
func (c *Child) Stop() {
	c.timeout.Stop()
	c.Kill()
}
