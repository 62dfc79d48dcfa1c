package server

import (
	"context"
	"net"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/testseed"
	"github.com/weftdb/weft/sgio"
)

// Issue 22, defect 13, the write: a reply larger than writeSliceBytes is handed to gnet a
// slice per wake-up of the event loop, never whole (gnet copies what the socket does not take
// into its outbound buffer, on the loop: one 16 MiB copy per reply to a slow reader delayed the
// loop's other connections). A reads 16 MiB and takes nothing while another connection of the
// same loop pings three times: each ping is answered while A's reply is only partly handed to
// gnet; then A reads it whole, and it went out in at least 16 slices of at most
// writeSliceBytes. Fails on b3f6c9d (and on 42826c1): the reply was handed to gnet in one
// writev, before any ping was answered.
func TestLargeReplyWrittenInSlices(t *testing.T) {
	const (
		owner, reader, pinger = 9, 7, 8
		pages                 = 4096 // of 64 rows of 64 bytes: 16 MiB of rows
	)
	var mu sync.Mutex
	var slices, handed, maxSlice int
	left := -1          // what A's reply has still to hand to gnet; -1 before it started
	var pongsLeft []int // left at each of the pinger's writes
	first := make(chan struct{})
	env := startServer(t, func(cfg *Config) {
		cfg.EventLoops = 1 // every connection on one loop
		cfg.writeHook = func(o uint64, n, l int, _ time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			switch o {
			case reader:
				if left == 0 || left < 0 && n < 64<<10 {
					return // the handshake's replies, the Pong after the reply
				}
				if left < 0 {
					close(first)
				}
				slices++
				handed += n
				maxSlice = max(maxSlice, n)
				left = l
			case pinger:
				pongsLeft = append(pongsLeft, left)
			}
		}
	})
	c := env.dial(owner)
	ti, g := srvTable(t, c, "sliced", owner)
	seq := g.LastSeq
	fillPages(t, c, ti.Table, owner, g.Epoch, &seq, pages)
	p := env.dial(pinger)
	require.NoError(t, p.CallInto(srvCtx(t), &sgio.Ping{}, &sgio.Pong{}))

	a := dialRaw(t, env.addr)
	a.maxBody = sgio.MaxBodyLimit
	a.handshake(reader)
	require.NoError(t, a.conn.(*net.TCPConn).SetReadBuffer(64<<10))
	wants := make([]base.PageWant, pages)
	for i := range wants {
		wants[i] = base.PageWant{Table: ti.Table, Page: uint64(i), Want: ^uint64(0)}
	}
	a.send(100, &sgio.ReadPages{Wants: wants})
	select {
	case <-first:
	case <-srvCtx(t).Done():
		t.Fatal("the reply was not handed to gnet")
	}
	mu.Lock()
	pongsLeft = pongsLeft[:0]
	mu.Unlock()
	for range 4 { // the hook of a write runs after it: the 4th pong says the 3rd's ran
		require.NoError(t, p.CallInto(srvCtx(t), &sgio.Ping{}, &sgio.Pong{}))
	}
	mu.Lock()
	during := append([]int(nil), pongsLeft...)
	mu.Unlock()

	f := a.read()
	require.Equal(t, sgio.TypeSegments, f.Type)
	require.Equal(t, uint64(100), f.ID)
	size := 8 + pages*sgio.SegmentHeaderSize + pages*64*64
	require.Len(t, f.Body, size)
	a.send(101, &sgio.Ping{})
	require.Equal(t, sgio.TypePong, a.read().Type)

	mu.Lock()
	defer mu.Unlock()
	t.Logf("16 MiB reply: %d slices, the largest %d bytes; A's bytes left at the pongs: %v", slices, maxSlice, during)
	require.GreaterOrEqual(t, len(during), 3)
	for i, l := range during {
		require.Positive(t, l, "ping %d answered only after A's reply was all handed to gnet", i)
	}
	require.Equal(t, sgio.HeaderSize+size, handed)
	require.GreaterOrEqual(t, slices, 16)
	require.LessOrEqual(t, maxSlice, writeSliceBytes)
	require.Zero(t, left)
}

// The measurement (WEFT_SOAK=1): the pings of a connection on the same event loop as
// a client that asks for 5 x 16 MiB of cached rows (the next once half the last is read) and
// reads them slowly (64 KiB a millisecond), against the same pings alone. It logs the latencies (docs/operations.md's
// limits table has them); it asserts only that every reply arrived whole.
func TestSoakLargeReadsSlowReaderPings(t *testing.T) {
	if !testseed.Soak() {
		t.Skip("WEFT_SOAK=1 measures the pings of an event loop that serves a slow reader of 5 x 16 MiB")
	}
	const (
		owner, reader = 9, 7
		pages         = 4096 // of 64 rows of 64 bytes: 16 MiB of rows
		reads         = 5
	)
	var mu sync.Mutex
	var writes int
	var longest, spent time.Duration // of the loop's writevs of the reader's bytes
	env := startServer(t, func(cfg *Config) {
		cfg.EventLoops = 1
		cfg.Options.CacheBytes = 64 << 20
		cfg.writeHook = func(o uint64, _, _ int, took time.Duration) {
			if o == reader {
				mu.Lock()
				writes++
				longest, spent = max(longest, took), spent+took
				mu.Unlock()
			}
		}
	})
	c := env.dial(owner)
	ti, g := srvTable(t, c, "soak", owner)
	seq := g.LastSeq
	fillPages(t, c, ti.Table, owner, g.Epoch, &seq, pages)
	wants := make([]base.PageWant, pages)
	for i := range wants {
		wants[i] = base.PageWant{Table: ti.Table, Page: uint64(i), Want: ^uint64(0)}
	}
	size := sgio.HeaderSize + 8 + pages*sgio.SegmentHeaderSize + pages*64*64
	stop := slowPings(t, env, "beside a slow reader of 5 x 16 MiB")
	a := dialRaw(t, env.addr)
	a.maxBody = sgio.MaxBodyLimit
	a.handshake(reader)
	start := time.Now()
	read := &sgio.ReadPages{Wants: wants}
	a.send(100, read)
	buf := make([]byte, 64<<10)
	for got, sent := 0, 1; got < reads*size; {
		if sent < reads && got >= sent*size-size/2 {
			// The next read once half of the last is taken: never more than 64 MiB
			// (outboundMaxBytes) asked for and untaken, so that the code before slices
			// (which copied the replies into gnet's outbound buffer) does not close it.
			a.send(uint64(100+sent), read)
			sent++
		}
		n, err := a.conn.Read(buf)
		require.NoError(t, err)
		got += n
		time.Sleep(time.Millisecond) // a slow reader: the pacing of the client, not a wait for the server
	}
	took := time.Since(start)
	stop()
	mu.Lock()
	t.Logf("the slow reader took %v for its 5 x 16 MiB; the loop handed them to gnet in %d writevs, %v in all, the longest %v",
		took, writes, spent, longest)
	mu.Unlock()
	stop = slowPings(t, env, "alone, as long")
	time.Sleep(took) // the measurement's window
	stop()
}

// slowPings pings on a connection of its own until stop, which logs the latencies' quantiles
// and how many pings took over 1 and 5 ms (the rare stalls a p99 does not show).
func slowPings(t *testing.T, env *srvEnv, name string) (stop func()) {
	c := env.dial(98)
	ctx := srvCtx(t)
	pings := pingLoop(c, func() context.Context { return ctx })
	return func() {
		lat, failure := pings()
		require.NoError(t, failure)
		require.NotEmpty(t, lat)
		slices.Sort(lat)
		over := func(d time.Duration) int {
			return len(lat) - sort.Search(len(lat), func(i int) bool { return lat[i] > d })
		}
		t.Logf("%s: %d pings, p50 %v, p99 %v, p99.9 %v, max %v; over 1 ms %d, over 5 ms %d", name, len(lat),
			lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)*999/1000], lat[len(lat)-1], over(time.Millisecond), over(5*time.Millisecond))
		_ = c.Close()
	}
}

// A connection paused behind a sliced write its client does not take (its replies held
// reached turnReplyMaxBytes) is not read by the session, but gnet reads its socket all the
// same: a client that keeps sending must not grow gnet's inbound buffer without end. Past
// stoppedInboundMaxBytes of requests buffered it is read again, so that its bound applies
// (more than outboundMaxBytes of its replies unsent closes it; replies built by goroutines
// wait for room instead, connReplyMaxBytes), whatever the write timeout (long here). A asks
// for 64 MiB of replies and takes none: what the socket buffers (at most 4 MiB on Linux,
// tcp_wmem, and the 64 KiB A's socket receives), gnet's outbound buffer (1.25 MiB) and the
// replies held behind the write (two turns' 4 MiB) take is about 14 MiB, 56 of the reads:
// with more than 100 read, A was read again. Fails without session.readOn: the connection
// stayed paused (about 53 reads) and gnet took all it sent.
func TestSlicedWriteStalledClientThatKeepsSending(t *testing.T) {
	env := startServer(t, func(cfg *Config) { cfg.WriteTimeout = time.Hour })
	env.watchCloses()
	owner := env.dial(5)
	ti := bigPage(t, owner)

	before := env.srv.Stats().Requests
	a := dialRaw(t, env.addr)
	a.handshake(0)
	require.NoError(t, a.conn.(*net.TCPConn).SetReadBuffer(64<<10))
	read := &sgio.ReadPages{Wants: []base.PageWant{{Table: ti.Table, Page: 0, Want: ^uint64(0)}}}
	var flood []byte
	for i := 0; len(flood) <= stoppedInboundMaxBytes+(1<<20); i++ {
		flood = sgio.AppendFrame(flood, uint64(100+i), read) // 256 KiB of reply each
	}
	_, _ = a.conn.Write(flood) // may fail once the server closed the connection
	closed := false
	require.Eventually(t, func() bool {
		select {
		case <-env.closed:
			closed = true
		default:
		}
		return closed || env.srv.Stats().Requests > before+100
	}, srvTestTimeout, time.Millisecond, "the connection holding %d MiB of requests was read again", len(flood)>>20)
	t.Logf("%d requests read, closed %v", env.srv.Stats().Requests-before, closed)
	_ = a.conn.Close()
}
