package server

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// pullAll pulls a backup over c into a new directory and finishes it.
func pullAll(t *testing.T, c *sgio.Client, chunkMax uint32) (string, storenode.BackupInfo) {
	t.Helper()
	ctx := srvCtx(t)
	dir := filepath.Join(t.TempDir(), "copy")
	d, err := storenode.NewBackupDir(nil, dir)
	require.NoError(t, err)
	defer d.Close()
	var stream uint64
	var chunk sgio.BackupChunk
	limit := int(chunkMax)
	if limit == 0 {
		limit = storenode.BackupChunkMax
	}
	for {
		require.NoError(t, c.CallInto(ctx, &sgio.Backup{Stream: stream, ChunkMax: chunkMax}, &chunk))
		require.LessOrEqual(t, len(chunk.Data), limit)
		stream = chunk.Stream
		if chunk.Kind == sgio.BackupKindEnd {
			info := storenode.BackupInfo{CheckpointLSN: chunk.Num, ThroughLSN: chunk.Offset}
			require.NoError(t, d.Finish(info))
			return dir, info
		}
		require.NoError(t, d.WriteChunk(ctx, storenode.BackupFile{Kind: storenode.BackupFileKind(chunk.Kind), Num: chunk.Num}, int64(chunk.Offset), chunk.Data))
	}
}

func TestServerBackup(t *testing.T) {
	env := startServer(t)
	c := env.dial(testOwner, asOperator)
	ctx := srvCtx(t)
	ti, g := srvAcquired(t, ctx, c, "items")
	seq := uint64(0)
	fillPages(t, c, ti.Table, testOwner, g.Epoch, &seq, 40)

	// Small pieces: a 4 KiB chunk limit splits the engine's pieces.
	dir, info := pullAll(t, c, 4096)
	require.GreaterOrEqual(t, info.ThroughLSN, info.CheckpointLSN)
	e, err := storenode.Open(storenode.Options{Dir: dir})
	require.NoError(t, err)
	tables := e.Tables()
	require.Len(t, tables, 1)
	orig := env.srv.Engine()
	for p := uint64(0); p < 40; p++ {
		want, _, wrows, err := orig.ReadRows(ti.Table, p, ^uint64(0), nil)
		require.NoError(t, err)
		got, _, grows, err := e.ReadRows(ti.Table, p, ^uint64(0), nil)
		require.NoError(t, err)
		require.Equal(t, want, got, "page %d", p)
		require.Equal(t, wrows, grows, "page %d", p)
	}
	require.NoError(t, e.Close())
	// The connection is idle again: another backup may start.
	pullAll(t, c, 0)
}

// TestServerBackupRefusals: requests that break the backup's rules are refused, and a
// client whose reply limit cannot hold a piece is told so.
func TestServerBackupRefusals(t *testing.T) {
	env := startServer(t)
	ctx := srvCtx(t)
	c := env.dial(testOwner, asOperator)
	var chunk sgio.BackupChunk
	err := c.CallInto(ctx, &sgio.Backup{Stream: 12345}, &chunk)
	require.ErrorIs(t, err, sgio.ErrMalformed, "a stream this connection did not start")
	require.NoError(t, c.CallInto(ctx, &sgio.Backup{}, &chunk))
	err = c.CallInto(ctx, &sgio.Backup{}, &chunk)
	require.ErrorIs(t, err, sgio.ErrBusy, "a second backup on the same connection")
	other := env.dial(testOwner+1, asOperator)
	err = other.CallInto(ctx, &sgio.Backup{Stream: chunk.Stream}, &chunk)
	require.ErrorIs(t, err, sgio.ErrMalformed, "another connection's stream")

	small := env.dial(testOwner+2, asOperator, func(cfg *sgio.ClientConfig) { cfg.MaxBody = 2048 })
	err = small.CallInto(ctx, &sgio.Backup{}, &chunk)
	require.ErrorIs(t, err, sgio.ErrFrameTooLarge)

	// A malformed body (a reserved field set) gets an error reply; before authentication a
	// Backup is refused like any request.
	r := dialRaw(t, env.addr)
	r.handshakeWith(testOwner+3, srvOperatorSecret)
	body := (&sgio.Backup{}).AppendBody(nil)
	body[12] = 1
	r.write(rawFrame(sgio.TypeBackup, 9, body))
	r.expectError(9, sgio.ErrMalformed)
	r2 := dialRaw(t, env.addr)
	r2.send(4, &sgio.Backup{})
	r2.expectError(4, sgio.ErrAuthFailed)
}

// TestServerBackupAbandoned: a client that starts a backup and goes away releases the
// engine's hold on the snapshot; checkpoints then free the pages again.
func TestServerBackupAbandoned(t *testing.T) {
	env := startServer(t)
	env.watchCloses()
	ctx := srvCtx(t)
	c, err := env.tryDial(testOwner, asOperator)
	require.NoError(t, err)
	ti, g := srvAcquired(t, ctx, c, "items")
	seq := uint64(0)
	fillPages(t, c, ti.Table, testOwner, g.Epoch, &seq, 8)
	e := env.srv.Engine()
	require.NoError(t, e.Checkpoint())

	b := env.dial(testOwner+1, asOperator)
	var chunk sgio.BackupChunk
	require.NoError(t, b.CallInto(ctx, &sgio.Backup{}, &chunk)) // the meta file: the hold is on
	n, _ := e.BackupHold()
	require.Equal(t, 1, n)
	fillPages(t, c, ti.Table, testOwner, g.Epoch, &seq, 8) // rewrites the same 8 pages
	require.NoError(t, e.Checkpoint())
	_, held := e.BackupHold()
	require.Equal(t, 8, held)

	require.NoError(t, b.Close())
	env.waitClosed(1)
	deadline := time.Now().Add(srvTestTimeout)
	for n, _ := e.BackupHold(); n != 0; n, _ = e.BackupHold() {
		require.True(t, time.Now().Before(deadline), "the abandoned backup still holds its snapshot")
		<-time.After(5 * time.Millisecond) // polling: the hold ends on the backup's goroutine
	}
	_, held = e.BackupHold()
	require.Zero(t, held)
	require.NoError(t, c.Close())
}

// TestBackupWireConstants: the engine's file kinds and piece bound are the wire's.
func TestBackupWireConstants(t *testing.T) {
	require.Equal(t, sgio.BackupChunkMax, storenode.BackupChunkMax)
	require.Equal(t, sgio.BackupKindEnd, uint8(storenode.BackupEnd))
	require.Equal(t, sgio.BackupKindMeta, uint8(storenode.BackupMeta))
	require.Equal(t, sgio.BackupKindData, uint8(storenode.BackupData))
	require.Equal(t, sgio.BackupKindWAL, uint8(storenode.BackupWAL))
}

// TestServerBackupClientStopsPulling: a client that starts a backup and then asks for nothing
// more, keeping its connection, loses the backup after the pull bound; the hold ends.
func TestServerBackupClientStopsPulling(t *testing.T) {
	defer func(d time.Duration) { backupPullWaitMax = d }(backupPullWaitMax)
	backupPullWaitMax = 50 * time.Millisecond
	env := startServer(t)
	ctx := srvCtx(t)
	c := env.dial(testOwner, asOperator)
	var chunk sgio.BackupChunk
	require.NoError(t, c.CallInto(ctx, &sgio.Backup{}, &chunk))
	e := env.srv.Engine()
	deadline := time.Now().Add(srvTestTimeout)
	for n, _ := e.BackupHold(); n != 0; n, _ = e.BackupHold() {
		require.True(t, time.Now().Before(deadline), "the unpulled backup still holds its snapshot")
		<-time.After(5 * time.Millisecond) // polling: the hold ends on the backup's goroutine
	}
	err := c.CallInto(ctx, &sgio.Backup{Stream: chunk.Stream}, &chunk)
	require.ErrorIs(t, err, sgio.ErrBusy, "the backup ended with storenode.ErrBackupTimeout")
	require.NoError(t, c.CallInto(ctx, &sgio.Ping{}, &sgio.Pong{}), "the connection lives on")
}
