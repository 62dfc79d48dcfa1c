package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/txnode"
)

// dirBytes returns every file of dir with its bytes.
func dirBytes(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	require.NoError(t, filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		require.NoError(t, err)
		if !info.IsDir() {
			b, err := os.ReadFile(p)
			require.NoError(t, err)
			out[p] = info.ModTime().String() + string(b)
		}
		return nil
	}))
	return out
}

func TestVerify(t *testing.T) {
	ctx := context.Background()
	dir := filledDir(t, 300)

	// An intact store: exit 0 and a summary.
	before := dirBytes(t, dir)
	code, out, errOut := weft(t, "verify", dir)
	require.Zero(t, code, "%s%s", out, errOut)
	require.Regexp(t, `(?m)^ok: 2 tables, [1-9]\d* pages \(270 rows\) checked in \d+ disk pages \(\d+ free\), 1 WAL segments, [1-9]\d* records \(\d+ bytes\) through LSN \d+, 0 notes$`, out)
	code, out2, _ := weft(t, "--dir", dir, "verify")
	require.Zero(t, code)
	require.Equal(t, out, out2)
	require.Equal(t, before, dirBytes(t, dir), "verify changed the store")

	// A running store is refused (exit 3), not read behind its owner's back.
	db, err := txnode.Open(ctx, txnode.Options{Dir: dir})
	require.NoError(t, err)
	code, _, errOut = weft(t, "verify", dir)
	require.Equal(t, exitUnchecked, code)
	// The DB is this process's: the refusal says so (another process's reads "locked by
	// another process").
	require.Contains(t, errOut, "already open in this process")
	require.NoError(t, db.Close(ctx))

	// Damage: one flipped byte of the meta file; exit 1, the finding names file and offset.
	meta := filepath.Join(dir, "meta")
	b, err := os.ReadFile(meta)
	require.NoError(t, err)
	b[20] ^= 1
	require.NoError(t, os.WriteFile(meta, b, 0o644))
	before = dirBytes(t, dir)
	code, out, errOut = weft(t, "verify", dir)
	require.Equal(t, exitDamaged, code, out)
	require.Regexp(t, `(?m)^damage: meta: offset \d+: checksum 0x[0-9a-f]{8} stored, 0x[0-9a-f]{8} computed over bytes \[0, \d+\)`, out)
	require.Contains(t, out, "DAMAGED (1 damage findings)")
	require.Contains(t, errOut, "is damaged")
	require.Equal(t, before, dirBytes(t, dir), "verify changed the damaged store")

	code, _, errOut = weft(t, "--timeout", "1ns", "verify", dir)
	require.Equal(t, exitUnchecked, code)
	require.Contains(t, errOut, "deadline exceeded")

	code, _, errOut = weft(t, "verify")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "usage: weft verify DIR")
	code, _, errOut = weft(t, "verify", filepath.Join(dir, "nothing"))
	require.Equal(t, exitUnchecked, code)
	require.Contains(t, errOut, "no such file")
}
