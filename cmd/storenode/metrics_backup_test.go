package main

import (
	"context"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/sgio"
)

// TestMetricsBackupHold: a backup holding its snapshot (a slow or stuck `weft backup` keeps
// replaced pages and WAL segments from being freed) shows in the metrics, so an operator sees
// why the data files and wal/ grow. On 71787ea only Engine.BackupHold reported it: a storage
// node's operator could not see it at all.
func TestMetricsBackupHold(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	r := startRun(t, []string{"--dir", dir, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--sync", "none"}, nil)
	c := dial(t, r.server.String(), nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	// The first piece (the meta file): the backup now holds its snapshot, waiting for the
	// next request.
	var chunk sgio.BackupChunk
	require.NoError(t, c.CallInto(ctx, &sgio.Backup{}, &chunk))
	require.Equal(t, sgio.BackupKindMeta, chunk.Kind)

	code, body := httpGet(t, "http://"+r.metrics.String()+"/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "weft_backups 1\n")
	require.Contains(t, body, "weft_backup_held_pages 0\n")
}
