package server

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/sgio"
)

// TestCreateTableNotExhaustedByOneClient: Options.MaxTables (4096 by default) bounds the
// node's tables with no share per owner or per credential: one client creates that many
// (empty, never held) tables and every other game server's CreateTable is then refused with
// ErrTooManyTables (ErrBusy) until an operator drops them.
//
// What should happen: one client cannot take every table of the node: a client's tables
// are bounded per owner (Options.MaxTablesPerOwner, MaxTables/8 by default; the clients'
// master secret still claims one owner id per session), so another owner's CreateTable
// succeeds. Fails on b3f6c9d: the victim's CreateTable gets ErrTooManyTables.
func TestCreateTableNotExhaustedByOneClient(t *testing.T) {
	const maxTables = 16
	env := startServer(t, func(cfg *Config) { cfg.Options.MaxTables = maxTables })
	ctx := srvCtx(t)
	c := env.dial(testOwner + 100)
	for i := 0; ; i++ {
		err := c.CallInto(ctx, &sgio.CreateTable{Name: fmt.Sprintf("junk-%d", i), RowBytes: 64}, &sgio.TableInfo{})
		if err != nil {
			require.ErrorIs(t, err, sgio.ErrBusy)
			break
		}
		require.Less(t, i, maxTables/8, "the per-owner bound (MaxTables/8 by default)")
	}
	v := env.dial(testOwner)
	require.NoError(t, v.CallInto(ctx, &sgio.CreateTable{Name: "players", RowBytes: 64}, &sgio.TableInfo{}),
		"one client took every table of the node")
}
