package server

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/sgio"
)

// TestServerBackupOnePullAtATime: while one Backup request of a connection waits for its
// piece, every other one is refused with ErrBusy, the first refusal and the ones after it:
// two requests pulling at once would hand out one piece twice, skip the next one's bytes and
// read the engine's buffer while the engine reuses it. On 71787ea the refusal itself cleared
// the "pulling" flag, so the request after it was let in next to the first.
func TestServerBackupOnePullAtATime(t *testing.T) {
	// The engine's backup starts with a checkpoint: its data-file sync waits at the gate, so
	// the first request waits for its piece as long as the test holds the gate.
	fs := vfs.NewFaultFS()
	var armed atomic.Bool
	entered, gate := make(chan struct{}, 1), make(chan struct{})
	fs.Inject(func(op vfs.Op) error {
		if armed.Load() && op.Kind == vfs.OpSync && !strings.Contains(op.Name, "wal") {
			select {
			case entered <- struct{}{}:
			default:
			}
			<-gate
		}
		return nil
	})
	env := startServer(t, func(cfg *Config) { cfg.Options.Dir, cfg.Options.FS = "db", fs })
	ctx := srvCtx(t)
	c := env.dial(7, asOperator)
	ti, g := srvTable(t, c, "b", 7)
	require.NoError(t, c.CallInto(ctx, srvCommit(ti.Table, 7, g.Epoch, g.LastSeq+1, []uint64{1}, 1), &sgio.CommitAck{}))

	armed.Store(true)
	released := false
	defer func() {
		if !released {
			close(gate)
		}
	}()
	stream := backupStreams.Load() + 1
	first := make(chan error, 1)
	var chunk sgio.BackupChunk
	go func() { first <- c.CallInto(ctx, &sgio.Backup{}, &chunk) }()
	select {
	case <-entered: // the backup's checkpoint waits at the gate
	case err := <-first:
		t.Fatalf("the first Backup request returned before its checkpoint: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the backup's checkpoint never synced")
	}
	var other sgio.BackupChunk
	require.ErrorIs(t, c.CallInto(ctx, &sgio.Backup{Stream: stream}, &other), sgio.ErrBusy)
	// Bounded: the fixed server answers at once; the broken one lets it wait for a piece.
	ctx2, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	require.ErrorIs(t, c.CallInto(ctx2, &sgio.Backup{Stream: stream}, &other), sgio.ErrBusy,
		"a second request pulled next to the first")

	armed.Store(false)
	close(gate)
	released = true
	require.NoError(t, <-first)
	require.Equal(t, stream, chunk.Stream)
	require.Equal(t, sgio.BackupKindMeta, chunk.Kind)
	require.Zero(t, chunk.Offset)
}
