package txnode

import (
	"context"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// countingProxy forwards loopback TCP connections to a storage node and counts the bytes in
// each direction: the wire's own witness of what crosses it.
type countingProxy struct {
	proxyConns
	target   string
	up, down atomic.Int64 // bytes client->node, node->client
}

func startCountingProxy(t *testing.T, target string) *countingProxy {
	p := &countingProxy{target: target}
	p.ln = listenLoopback(t)
	acceptPairs(p.ln, target, &p.wg, func(c, s net.Conn) {
		p.add(c, s)
		go p.pipe(s, c, &p.up)
		go p.pipe(c, s, &p.down)
	})
	t.Cleanup(p.close)
	return p
}

func (p *countingProxy) pipe(dst, src net.Conn, n *atomic.Int64) {
	defer p.wg.Done()
	buf := make([]byte, 64<<10)
	for {
		k, err := src.Read(buf)
		if k > 0 {
			n.Add(int64(k))
			if _, werr := dst.Write(buf[:k]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				dst.Close()
			}
			return
		}
	}
}

func (p *countingProxy) snapshot() (up, down int64) { return p.up.Load(), p.down.Load() }

// TestSparseIO shows on the wire that a random single-row miss sends one small request with
// no row bytes and receives one frame carrying just that row, and that a sequential scan
// moves whole pages.
func TestSparseIO(t *testing.T) {
	ctx := context.Background()
	// A long lease: no renewal traffic lands inside the measured windows.
	addr, _ := startStorageNodeWith(t, storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone, LeaseDuration: time.Hour})
	const rows = 64 * 64 // 64 full pages
	{
		db := openDB(t, ctx, Options{StoreAddr: addr, OwnerID: 5})
		items := newTable(t, ctx, db, "items", 64)
		for i := range rows {
			insertRow(t, ctx, items, row(uint64(i)))
		}
		require.NoError(t, db.Close(ctx))
	}

	proxy := startCountingProxy(t, addr)
	db := openDB(t, ctx, Options{StoreAddr: proxy.ln.Addr().String(), OwnerID: 5})
	defer db.Close(ctx)
	items := openTable(t, ctx, db, "items")

	// One random single-row miss.
	const readPagesRequest = sgio.HeaderSize + 8 + 24                     // one PageWant
	const oneRowReply = sgio.HeaderSize + 8 + sgio.SegmentHeaderSize + 64 // one segment, one row
	up0, down0 := proxy.snapshot()
	buf := make([]byte, 64)
	require.NoError(t, items.Get(ctx, 64*37+11, buf))
	require.Equal(t, row(64*37+11), buf)
	up1, down1 := proxy.snapshot()
	require.Equal(t, int64(readPagesRequest), up1-up0, "the miss request carries no row bytes")
	require.Equal(t, int64(oneRowReply), down1-down0, "the reply carries the one row, not the page")
	t.Logf("single-row miss: %d bytes up, %d bytes down (a full page would be %d)", up1-up0, down1-down0, 4096)

	// A second Get of the same row is a hit: nothing crosses the wire.
	require.NoError(t, items.Get(ctx, 64*37+11, buf))
	up2, down2 := proxy.snapshot()
	require.Equal(t, up1, up2)
	require.Equal(t, down1, down2)

	// A sequential scan of 16 pages moves whole pages: at least 16*4096 row bytes come down.
	n := 0
	for r, err := range items.Scan(ctx, 64*40, 64*56) {
		require.NoError(t, err)
		require.Equal(t, row(r.ID), r.Data)
		n++
	}
	require.Equal(t, 16*64, n)
	_, down3 := proxy.snapshot()
	require.GreaterOrEqual(t, down3-down2, int64(16*4096))
	require.Less(t, down3-down2, int64(16*(4096+sgio.SegmentHeaderSize)+4096), "pages, not more")
	t.Logf("scan of 16 pages: %d bytes down", down3-down2)
}
