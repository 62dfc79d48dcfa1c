package storenode

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/sgio"
)

// TestServerBackupOnePullAtATime: while one Backup request of a connection waits for its
// piece, every other one is refused with ErrBusy, the first refusal and the ones after it:
// two requests pulling at once would hand out one piece twice, skip the next one's bytes and
// read the engine's buffer while the engine reuses it. On 71787ea the refusal itself cleared
// the "pulling" flag, so the request after it was let in next to the first.
func TestServerBackupOnePullAtATime(t *testing.T) {
	env := startServer(t)
	ctx := srvCtx(t)
	c := env.dial(testOwner)
	e := env.srv.Engine()

	// The engine's backup waits at its first checkpoint, so the first request waits for its
	// piece as long as the test holds ckptMu.
	e.ckptMu.Lock()
	locked := true
	defer func() {
		if locked {
			e.ckptMu.Unlock()
		}
	}()
	stream := backupStreams.Load() + 1
	first := make(chan error, 1)
	var chunk sgio.BackupChunk
	go func() { first <- c.CallInto(ctx, &sgio.Backup{}, &chunk) }()
	for backupStreams.Load() < stream {
		select {
		case err := <-first:
			t.Fatalf("the first Backup request returned before its backup started: %v", err)
		case <-time.After(time.Millisecond): // polling: the request's goroutine starts the backup
		}
	}
	var other sgio.BackupChunk
	require.ErrorIs(t, c.CallInto(ctx, &sgio.Backup{Stream: stream}, &other), sgio.ErrBusy)
	// Bounded: the fixed server answers at once; the broken one lets it wait for a piece.
	ctx2, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	require.ErrorIs(t, c.CallInto(ctx2, &sgio.Backup{Stream: stream}, &other), sgio.ErrBusy,
		"a second request pulled next to the first")

	e.ckptMu.Unlock()
	locked = false
	require.NoError(t, <-first)
	require.Equal(t, stream, chunk.Stream)
	require.Equal(t, sgio.BackupKindMeta, chunk.Kind)
	require.Zero(t, chunk.Offset)
}
