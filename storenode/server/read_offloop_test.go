package server

import (
	"bytes"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/sgio"
)

// Issue 22, defect 13: cached reads were answered on the event loop whatever their size (up
// to the client's 64 MiB reply limit), and a client asking for 5 x 16 MiB delayed the pings
// of every other connection of its loop by 80-120 ms. A cached read of more than
// inlineReadMaxBytes is built on a read goroutine: while its builder is held (the hook), a
// ping on the same connection and one from another connection of the same loop are
// answered; then the read is answered whole. Fails on b3f6c9d, which built it on the loop.
func TestLargeCachedReadLeavesEventLoop(t *testing.T) {
	const rowBytes, pages = 4096, 5 // 5 x 256 KiB of rows: above inlineReadMaxBytes
	var armed atomic.Bool
	var built atomic.Int64
	entered, unblock := make(chan struct{}, 1), make(chan struct{})
	env := startServer(t, func(cfg *Config) {
		cfg.EventLoops = 1 // every connection on one loop
		cfg.readHook = func(m sgio.Message) {
			if _, ok := m.(*sgio.ReadPages); ok && armed.Load() {
				built.Add(1)
				entered <- struct{}{}
				<-unblock
			}
		}
	})
	ctx := srvCtx(t)
	c := env.dial(5)
	other := env.dial(6)
	var ti sgio.TableInfo
	require.NoError(t, c.CallInto(ctx, &sgio.CreateTable{Name: "big", RowBytes: rowBytes}, &ti))
	var g sgio.Grant
	require.NoError(t, c.CallInto(ctx, &sgio.Acquire{Table: ti.Table, Owner: 5}, &g))
	require.NoError(t, srvGrant(ctx, c, ti.Table, 5, g.Epoch, pages))
	commit := &sgio.Commit{Owner: 5, Seq: 1, Fences: []base.Fence{{Table: ti.Table, Epoch: g.Epoch}}}
	want := &sgio.ReadPages{}
	for p := range uint64(pages) {
		rows := bytes.Repeat([]byte{byte(p + 1)}, 64*rowBytes)
		commit.Segments = append(commit.Segments, base.Segment{Table: ti.Table, RowBytes: rowBytes, Page: p, Data: ^uint64(0), Rows: rows})
		want.Wants = append(want.Wants, base.PageWant{Table: ti.Table, Page: p, Want: ^uint64(0)})
	}
	require.NoError(t, c.CallInto(ctx, commit, &sgio.CommitAck{})) // the pages stay cached
	require.Greater(t, pages*64*rowBytes, inlineReadMaxBytes)

	armed.Store(true)
	done := make(chan error, 1)
	var got sgio.Segments
	go func() { done <- c.CallInto(ctx, want, &got) }()
	select {
	case <-entered:
	case <-ctx.Done():
		t.Fatal("the large cached read was not built off the event loop")
	}
	require.NoError(t, c.CallInto(ctx, &sgio.Ping{}, &sgio.Pong{}), "a ping on the same connection while the read is built")
	require.NoError(t, other.CallInto(ctx, &sgio.Ping{}, &sgio.Pong{}), "a ping of another connection of the loop")
	require.Empty(t, done)
	close(unblock)
	require.NoError(t, <-done)
	require.EqualValues(t, 1, built.Load())
	require.Len(t, got.Segments, pages)
	for p, s := range got.Segments {
		require.Equal(t, ^uint64(0), s.Data)
		require.Equal(t, bytes.Repeat([]byte{byte(p + 1)}, 64*rowBytes), s.Rows)
	}
}
