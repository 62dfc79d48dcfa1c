package testkit

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/vfs"
)

// A WAL fsync waits for Release and then fails with ErrEIO when told to; a sync of any other
// file goes through at once.
func TestBlockSyncs(t *testing.T) {
	for _, fail := range []bool{false, true} {
		fs := vfs.NewFaultFS()
		require.NoError(t, fs.MkdirAll("d/wal"))
		other, err := fs.Create("d/data")
		require.NoError(t, err)
		wal, err := fs.Create("d/wal/0001")
		require.NoError(t, err)
		b := NewBlockSyncs(fs)
		require.NoError(t, other.Sync(), "not a WAL file")
		done := make(chan error, 1)
		go func() { done <- wal.Sync() }()
		b.WaitBlocked(t, 10*time.Second)
		select {
		case err := <-done:
			t.Fatalf("the WAL fsync went through before Release: %v", err)
		default:
		}
		b.Release(fail)
		err = <-done
		if fail {
			require.ErrorIs(t, err, ErrEIO)
		} else {
			require.NoError(t, err)
		}
	}
}

func TestRow64(t *testing.T) {
	r := Row64(10)
	require.Len(t, r, 64)
	for i := range 8 {
		require.Equal(t, uint64(10+i), binary.LittleEndian.Uint64(r[i*8:]))
	}
}

// SkipUnderRace skips exactly when the race detector is on.
func TestSkipUnderRace(t *testing.T) {
	ran := false
	t.Run("suite", func(t *testing.T) {
		SkipUnderRace(t, "a kill suite (child processes)")
		ran = true
	})
	require.Equal(t, !RaceOn, ran)
}

// HelperSpec returns the parent's spec, and skips the helper when there is none.
func TestHelperSpec(t *testing.T) {
	const env = "WEFT_TESTKIT_HELPER_SPEC"
	t.Setenv(env, "a|b")
	require.Equal(t, "a|b", HelperSpec(t, env, "TestHelperSpec"))
	t.Setenv(env, "")
	ran := false
	t.Run("unset", func(t *testing.T) {
		HelperSpec(t, env, "TestHelperSpec")
		ran = true
	})
	require.False(t, ran, "a helper with no spec skips")
}

// A client trusting TLSConfigs' pool completes a handshake with its server over loopback, and
// WriteCert's files load as a key pair.
func TestTLSConfigs(t *testing.T) {
	server, client := TLSConfigs(t)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", server)
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			err = c.(*tls.Conn).Handshake()
			c.Close()
		}
		accepted <- err
	}()
	c, err := tls.Dial("tcp", ln.Addr().String(), client)
	require.NoError(t, err)
	require.NoError(t, c.Close())
	require.NoError(t, <-accepted)

	certFile, keyFile, pool := WriteCert(t)
	_, err = tls.LoadX509KeyPair(certFile, keyFile)
	require.NoError(t, err)
	require.NotNil(t, pool)
}

// TreeState tells a changed file from an unchanged tree; SyncBuffer keeps what is written.
func TestTreeStateAndSyncBuffer(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a"), []byte("x"), 0o644))
	before := TreeState(t, dir)
	require.Equal(t, before, TreeState(t, dir))
	require.Contains(t, before, "a")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a"), []byte("y"), 0o644))
	require.NotEqual(t, before["a"], TreeState(t, dir)["a"])

	var b SyncBuffer
	_, err := b.Write([]byte("ab"))
	require.NoError(t, err)
	_, err = b.Write([]byte("c"))
	require.NoError(t, err)
	require.Equal(t, "abc", b.String())
}

// CloseAtCleanup closes when the test ends, not before, under a context bounded by within.
func TestCloseAtCleanup(t *testing.T) {
	closed := false
	var deadline time.Time
	t.Run("test", func(t *testing.T) {
		CloseAtCleanup(t, time.Minute, func(ctx context.Context) error {
			closed = true
			deadline, _ = ctx.Deadline()
			return nil
		})
		require.False(t, closed, "not before the test ends")
	})
	require.True(t, closed)
	require.WithinDuration(t, time.Now().Add(time.Minute), deadline, 10*time.Second)
}
