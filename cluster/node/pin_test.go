package node_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/cluster"
	"github.com/weftdb/weft/cluster/node"
	"github.com/weftdb/weft/txnode/txncoord"
)

// TestPinPartition: a game server pins the partition of its zone; reads of another partition
// many times its cache leave it cached (no miss), and Stats tells each partition's hits,
// misses, pin, ownership and storage node.
func TestPinPartition(t *testing.T) {
	ctx := testCtx(t)
	tc := startCluster(t, 1)
	const rowBytes = 1024 // 64 KiB pages: the 1 MiB cache holds about 13
	b := tc.open(t, 0xb, "game-b:7000")
	tb := createTable(t, ctx, b, "zones", rowBytes, 2, 1, tc.addrs)
	require.NoError(t, tb.Own(ctx, 1))
	var big []uint64
	for range 32 { // 32 pages of partition 1
		require.NoError(t, b.Update(ctx, func(tx *node.Tx) error {
			big = big[:len(big)/64*64]
			for range 64 {
				id, err := tx.Insert(tb, make([]byte, rowBytes))
				if err != nil {
					return err
				}
				big = append(big, id)
			}
			return nil
		}))
	}
	require.NoError(t, b.Close(ctx)) // gives partition 1 up

	a := tc.open(t, 0xa, "game-a:7000")
	ta := openTable(t, ctx, a, "zones")
	require.ErrorIs(t, ta.Pin(ctx, 0), node.ErrNotOwner)
	require.NoError(t, ta.Own(ctx, 0))
	var zone []uint64
	for i := range 128 {
		row := make([]byte, rowBytes)
		row[0] = byte(i)
		id := insertRow(t, ctx, ta, row)
		require.Equal(t, uint32(0), ta.Partition(id))
		zone = append(zone, id)
	}
	require.NoError(t, ta.Pin(ctx))
	require.NoError(t, ta.Own(ctx, 1))
	st := ta.Stats()
	require.Len(t, st, 2)
	require.Equal(t, tc.addrs[0], st[0].Node)
	require.True(t, st[0].Owned)
	require.True(t, st[0].Pinned)
	require.Positive(t, st[0].PinnedPages)
	require.False(t, st[1].Pinned)
	pinned := a.StoreStats()[tc.addrs[0]].PinnedBytes
	require.Equal(t, st[0].PinnedBytes, pinned)

	buf := make([]byte, rowBytes)
	for _, id := range big {
		require.NoError(t, ta.Get(ctx, id, buf))
	}
	require.Greater(t, a.StoreStats()[tc.addrs[0]].Evictions, uint64(16), "partition 1 went through the cache")
	before := ta.Stats()
	for i, id := range zone {
		require.NoError(t, ta.Get(ctx, id, buf))
		require.Equal(t, byte(i), buf[0])
	}
	after := ta.Stats()
	require.Equal(t, before[0].Misses, after[0].Misses, "a pinned partition's page was evicted")
	require.Equal(t, before[0].Hits+uint64(len(zone)), after[0].Hits)
	require.InDelta(t, float64(after[0].Hits)/float64(after[0].Hits+after[0].Misses), after[0].HitRate(), 1e-12)
	require.Positive(t, after[1].Misses)
	require.Less(t, after[1].HitRate(), 0.99)

	ta.Unpin()
	require.False(t, ta.Stats()[0].Pinned)
	require.Zero(t, a.StoreStats()[tc.addrs[0]].PinnedBytes)
}

// TestOpenRefusesPinBytesOverCache: a PinBytes over three quarters of CacheBytes fails
// node.Open (ErrInvalid), before it dials etcd; it used to fail only the first table of each
// storage node, as that storage node's transaction node refused to open.
func TestOpenRefusesPinBytesOverCache(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, cfg := range []node.Config{
		{CacheBytes: 1 << 20, PinBytes: 1 << 20},
		{PinBytes: txncoord.CacheBytes(0)},                        // CacheBytes 0: txnode's default
		{CacheBytes: 1, PinBytes: txncoord.CacheBytes(1) * 7 / 8}, // CacheBytes raised to txnode's least
	} {
		cfg.Session = cluster.SessionConfig{Owner: 1, Addr: "127.0.0.1:7000"}
		cfg.Etcd = cluster.Config{Endpoints: []string{"http://127.0.0.1:1"}, DialTimeout: time.Second}
		_, err := node.Open(ctx, cfg)
		require.ErrorIs(t, err, cluster.ErrInvalid, "CacheBytes %d PinBytes %d", cfg.CacheBytes, cfg.PinBytes)
		require.ErrorContains(t, err, "PinBytes")
	}
}

// TestPinReleasedWhenGrantLost: a pinned partition whose grant is gone (the session closed)
// shows as not owned and not pinned in Stats, and its pages no longer count against the
// storage node's pin budget, though no operation touched it since. It used to stay owned and
// pinned, its pages held, until an operation on the partition noticed.
func TestPinReleasedWhenGrantLost(t *testing.T) {
	ctx := testCtx(t)
	tc, a, ta := startWithTable(t, ctx, 1, 0xa, "game-a:7000", "zones", 1)
	require.NoError(t, ta.Own(ctx, 0))
	insertRow(t, ctx, ta, make([]byte, 64))
	require.NoError(t, ta.Pin(ctx))
	require.True(t, ta.Stats()[0].Pinned)
	require.Positive(t, a.StoreStats()[tc.addrs[0]].PinnedBytes)

	require.NoError(t, a.Session().Close(ctx))
	st := ta.Stats()[0]
	require.False(t, st.Owned, "a lost partition")
	require.False(t, st.Pinned)
	require.Zero(t, a.StoreStats()[tc.addrs[0]].PinnedBytes)
	require.ErrorIs(t, ta.Pin(ctx, 0), node.ErrNotOwner)
}
