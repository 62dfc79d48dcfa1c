package procinfo

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestFlockHolderNamesTheProcess(t *testing.T) {
	name := filepath.Join(t.TempDir(), "LOCK")
	f, err := os.Create(name)
	require.NoError(t, err)
	defer f.Close()
	info, err := f.Stat()
	require.NoError(t, err)
	_, ok := FlockHolder(info)
	require.False(t, ok, "no lock yet")

	require.NoError(t, unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB))
	p, ok := FlockHolder(info)
	require.True(t, ok)
	require.Equal(t, os.Getpid(), p.PID)
	require.NotEmpty(t, p.Name)
	require.Contains(t, HeldBy(p, ok), ": held by process ")
}

func TestListenerHolderNamesTheProcess(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	p, ok := ListenerHolder(port)
	require.True(t, ok)
	require.Equal(t, os.Getpid(), p.PID)
	require.NoError(t, ln.Close())
	_, ok = ListenerHolder(port)
	require.False(t, ok, "closed")
	require.Empty(t, HeldBy(Process{}, false))
}
