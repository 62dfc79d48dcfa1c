package testkit

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// SyncBuffer collects output (a run's, a logger's) safe for concurrent use. The zero value is
// ready.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns everything written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TreeState describes every entry under dir (dir included, as "."), by its path relative to
// dir: its mode and modification time and, for a regular file, its size and a hash of its
// content. Two states are equal when nothing under dir changed. A walk error (dir missing
// too) fails the test.
func TreeState(t testing.TB, dir string) map[string]string {
	t.Helper()
	state := map[string]string{}
	walkInfo(t, dir, func(p string, fi fs.FileInfo) error {
		st := fi.Mode().String() + " " + fi.ModTime().Format(time.RFC3339Nano)
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			st += fmt.Sprintf(" %d %x", len(b), sha256.Sum256(b))
		}
		rel, _ := filepath.Rel(dir, p)
		state[rel] = st
		return nil
	})
	return state
}

// walkInfo calls f with the path and the file info of every entry under dir (dir included),
// failing the test on the first error of the walk or of f.
func walkInfo(t testing.TB, dir string, f func(p string, fi fs.FileInfo) error) {
	t.Helper()
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		return f(p, fi)
	}))
}
