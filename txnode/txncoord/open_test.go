package txncoord_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/txnode"
	"github.com/weftdb/weft/txnode/txncoord"
)

// noGrants refuses every grant: a local table never asks for one.
type noGrants struct{}

func (noGrants) Grant(context.Context, string, uint32) (uint64, func() error, func(context.Context) error, error) {
	return 0, nil, nil, errors.New("no grants here")
}

// Open opens a node as txnode.Open does, with grants for its cluster-managed tables; nil
// grants are refused (that node is txnode.Open's).
func TestOpenWithGrants(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := txncoord.Open(ctx, txnode.Options{Dir: t.TempDir()}, nil)
	require.ErrorContains(t, err, "without grants")

	db, err := txncoord.Open(ctx, txnode.Options{Dir: t.TempDir()}, noGrants{})
	require.NoError(t, err)
	defer db.Close(ctx)
	tb, err := db.CreateTable(ctx, "local", 64)
	require.NoError(t, err)
	id, err := tb.Insert(ctx, row(9))
	require.NoError(t, err)
	dst := make([]byte, 64)
	require.NoError(t, tb.Get(ctx, id, dst))
	require.Equal(t, row(9), dst)
}
