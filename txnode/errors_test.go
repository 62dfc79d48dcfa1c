package txnode

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// TestStoreErrorsReadRight: the store's errors a game meets match txnode's re-exported
// sentinels (ErrTableExists, ErrTableNotFound, ErrBadName, ErrRowSize) and storenode's under
// errors.Is, embedded and over TCP (wire codes) alike, and an embedded store's never read as
// the wire's ("sgio: ...").
func TestStoreErrorsReadRight(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range openConfigs(t) {
		if cfg.durability != Durable {
			continue
		}
		t.Run(cfg.name, func(t *testing.T) {
			db := cfg.opener(t)(Options{})
			newTable(t, ctx, db, "items", 64)
			_, err := db.CreateTable(ctx, "items", 64)
			require.ErrorIs(t, err, ErrTableExists)
			require.ErrorIs(t, err, storenode.ErrTableExists)
			require.ErrorIs(t, err, sgio.ErrTableExists)
			embedded := strings.HasPrefix(cfg.name, "embedded")
			if embedded {
				require.NotContains(t, err.Error(), "sgio")
			}
			_, err = db.Table(ctx, "missing")
			require.ErrorIs(t, err, ErrTableNotFound)
			require.ErrorIs(t, err, storenode.ErrTableNotFound)
			if embedded {
				require.NotContains(t, err.Error(), "sgio")
			}
			_, err = db.CreateTable(ctx, "bad name!", 64)
			require.ErrorIs(t, err, storenode.ErrBadName)
			require.ErrorIs(t, err, ErrBadName)
			if embedded {
				require.NotContains(t, err.Error(), "sgio")
			}
			_, err = db.CreateTable(ctx, "odd", 7)
			require.ErrorIs(t, err, storenode.ErrRowSize)
			require.ErrorIs(t, err, ErrRowSize)
		})
	}
}

// TestOpenDirTwiceInProcess: opening a directory this process already has open says so
// (storenode.ErrAlreadyOpen), not that another process holds it.
func TestOpenDirTwiceInProcess(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	db := openDB(t, ctx, Options{Dir: dir, SyncMode: "none"})
	_, err := Open(ctx, Options{Dir: dir, SyncMode: "none"})
	require.ErrorIs(t, err, storenode.ErrAlreadyOpen)
	require.ErrorIs(t, err, storenode.ErrLocked)
	require.ErrorIs(t, err, ErrAlreadyOpen)
	require.ErrorIs(t, err, ErrLocked)
	require.NotContains(t, err.Error(), "another process")
	require.NoError(t, db.Close(ctx))
	db, err = Open(ctx, Options{Dir: dir, SyncMode: "none"})
	require.NoError(t, err, "free once the first DB closed")
	require.NoError(t, db.Close(ctx))
}

// The storage node's errors a game handles are txnode's own names (issue 23 item 10: a game
// matched strings or imported storenode for them): each matches its storage node sentinel,
// and ErrMoved matches ErrFenced, as the storage node's does.
func TestGameErrorsExported(t *testing.T) {
	for _, c := range []struct{ ours, theirs error }{
		{ErrFenced, storenode.ErrFenced}, {ErrMoved, storenode.ErrMoved}, {ErrTxnBusy, storenode.ErrTxnBusy},
		{ErrTxnLocked, storenode.ErrTxnLocked}, {ErrTxnDecided, storenode.ErrTxnDecided},
		{ErrBadName, storenode.ErrBadName}, {ErrLocked, storenode.ErrLocked}, {ErrOldFormat, storenode.ErrOldFormat},
		{ErrFailStop, storenode.ErrFailStop}, {ErrTooManyTables, storenode.ErrTooManyTables},
		{ErrRowSize, storenode.ErrRowSize}, {ErrBusy, storenode.ErrTooManyTables}, {ErrBusy, storenode.ErrTxnBusy},
		{ErrCorruption, storenode.ErrMalformed},
	} {
		require.ErrorIs(t, c.theirs, c.ours)
		require.ErrorIs(t, fmt.Errorf("wrapped: %w", c.theirs), c.ours)
	}
	require.ErrorIs(t, ErrMoved, ErrFenced)
}
