package server

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/testkit"
	"github.com/weftdb/weft/sgio"
)

// Tests of the review of the hostile-client work (issue 11): each fails on the code before
// its fix.

// waitFor waits, bounded, until cond holds: for server-side progress that nothing on the
// wire shows.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(srvTestTimeout)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, srvTestTimeout)
		}
		<-tick.C
	}
}

// Found in review: evicting the oldest handshaking connection let a flood of sockets that
// send nothing, from 127.0.0.1 like every transaction node, evict a client in the middle of
// its handshake: MaxHandshakesPerSource idle connects during its last round trip were
// enough, at any rate. Now an idle socket, or a connection whose proof was wrong, is evicted
// before a client that was answered with HelloReply.
func TestServerFloodSparesClientMidHandshake(t *testing.T) {
	const perSource = 4
	env := startServer(t, func(cfg *Config) {
		cfg.MaxConns = 64
		cfg.MaxHandshakes = 16
		cfg.MaxHandshakesPerSource = perSource
		cfg.AuthFailDelay = time.Minute // the wrong proof waits; the test ends first
	})
	env.watchCloses()

	legit := dialRaw(t, env.addr)
	hr := legit.hello(7) // the client is now owed nothing but its Auth

	// A wrong proof, then idle sockets: more than the source's slots.
	wrong := dialRaw(t, env.addr)
	whr := wrong.hello(8)
	wrong.send(1, &sgio.Auth{Proof: sgio.ClientProof(srvOtherSecret[:16], whr.Nonce, wrong.nonce, wrong.transcript)})
	waitFor(t, "the wrong proof was seen", func() bool { return env.srv.Stats().AuthFailures == 1 })

	var idle []net.Conn
	for range 3 * perSource {
		c, err := net.DialTimeout("tcp", env.addr, srvTestTimeout)
		require.NoError(t, err)
		idle = append(idle, c)
	}
	defer func() {
		for _, c := range idle {
			_ = c.Close()
		}
	}()
	// Every connect over the limit evicted one handshaking connection.
	env.waitClosed(3*perSource + 2 - perSource)
	require.Equal(t, uint64(3*perSource+2-perSource), env.srv.Stats().Evictions)

	// The client mid-handshake survived the flood: its Auth is answered.
	key := srvKey(t)
	legit.send(1, &sgio.Auth{Proof: sgio.ClientProof(key, hr.Nonce, legit.nonce, legit.transcript)})
	f := legit.read()
	require.Equal(t, sgio.TypeAuthOK, f.Type, "%v", f)
	// The wrong proof was the first to go.
	wrong.expectClosed()
	legit.send(2, &sgio.Ping{})
	require.Equal(t, sgio.TypePong, legit.read().Type)
}

// Found in review: gnet's private unix socket (the listener gnet.Run needs, which nobody
// should reach) stayed in a directory under TMPDIR for the server's life: a kill -9 left
// one behind for good each time, and a local process of the same user could connect to it.
// It is now unlinked as soon as the event loops are proven running.
func TestServerGnetSocketUnlinked(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	env := startServer(t, func(cfg *Config) { cfg.Options.Dir = filepath.Join(tmp, "data") })
	left, err := filepath.Glob(filepath.Join(tmp, "storenode-gnet-*"))
	require.NoError(t, err)
	require.Empty(t, left, "gnet's socket directory exists while the server runs")
	c := env.dial(3)
	require.NoError(t, c.CallInto(srvCtx(t), &sgio.Ping{}, &sgio.Pong{}))
	env.stop()
	left, err = filepath.Glob(filepath.Join(tmp, "storenode-gnet-*"))
	require.NoError(t, err)
	require.Empty(t, left)
}

// Found in review: only reads reserved room for their replies under connReplyMaxBytes; the
// other requests' goroutines (ListTables above all: a reply per table) appended theirs to
// the pending replies without bound. A client that pipelines ListTables and reads nothing
// made a TLS connection (whose write blocks until WriteTimeout) hold MaxInflight such replies:
// 1024 x 40 KiB here, 1024 x 330 KiB with 4096 tables.
func TestServerListTablesRepliesBounded(t *testing.T) {
	serverTLS, clientTLS := testkit.TLSConfigs(t)
	env := startServer(t, func(cfg *Config) {
		cfg.TLS = serverTLS
		cfg.WriteTimeout = 2 * time.Second // the close that ends the test
	})
	env.watchCloses()
	c := env.dial(1, func(cfg *sgio.ClientConfig) { cfg.TLS = clientTLS })
	tables := scaledN(512, 512)
	for i := range tables {
		var ti sgio.TableInfo
		name := fmt.Sprintf("%060d", i)
		require.NoError(t, c.CallInto(srvCtx(t), &sgio.CreateTable{Name: name, RowBytes: 64}, &ti))
	}
	var list sgio.TableList
	require.NoError(t, c.CallInto(srvCtx(t), &sgio.ListTables{}, &list))
	replySize := int64(sgio.HeaderSize + list.BodySize())

	r := dialSlowTLS(t, env, clientTLS, 0)
	r.handshake(2)
	sess := env.sessionOf(t, 2)

	const pipelined = 1024
	var burst []byte
	for i := range pipelined {
		burst = sgio.AppendFrame(burst, uint64(10+i), &sgio.ListTables{})
	}
	r.write(burst)    // and never read
	env.waitClosed(1) // the write timeout
	sess.mu.Lock()
	peak := sess.heldPeak
	sess.mu.Unlock()
	t.Logf("%d ListTables of %d bytes unread: peak %d KiB of replies held (bound %d KiB + one reply)",
		pipelined, replySize, peak>>10, connReplyMaxBytes>>10)
	bound := int64(sgio.HeaderSize + 8 + tables*tableInfoBodyMax)
	require.GreaterOrEqual(t, bound, replySize)
	require.LessOrEqual(t, peak, connReplyMaxBytes+bound)
	require.NoError(t, c.CallInto(srvCtx(t), &sgio.Ping{}, &sgio.Pong{}))
}

// Found in review: over TLS, every stranger whose TLS handshake failed (plain bytes sent to
// the TLS port, a scanner) wrote a warning of its own: the one log line of a stranger that
// was not rate-limited.
func TestServerTLSHandshakeFailuresRateLimited(t *testing.T) {
	serverTLS, _ := testkit.TLSConfigs(t)
	const strangers = 100
	env := startServer(t, func(cfg *Config) {
		cfg.TLS = serverTLS
		// Room for every stranger's handshake: on a loaded machine they pile up, and the
		// evictions of older ones (logged through the same limiter) could take every line
		// of a window, leaving no "TLS handshake failed" to count.
		cfg.MaxHandshakes, cfg.MaxHandshakesPerSource = strangers, strangers
	})
	env.watchCloses()
	start := time.Now()
	junk := bytes.Repeat([]byte("GET / HTTP/1.0\r\n\r\n"), 4)
	for range strangers {
		c, err := net.DialTimeout("tcp", env.addr, srvTestTimeout)
		require.NoError(t, err)
		_, err = c.Write(junk)
		require.NoError(t, err)
		_ = c.Close()
	}
	env.waitClosed(strangers)
	elapsed := time.Since(start)
	lines := strings.Count(env.logs.String(), "TLS handshake failed")
	t.Logf("%d failed TLS handshakes in %v: %d log lines", strangers, elapsed.Round(time.Millisecond), lines)
	require.Positive(t, lines)
	require.LessOrEqual(t, lines, int(elapsed/time.Second+2)*refusalLogPerSec, "rate-limited")
}

// Found in review: over TLS, a connection refused without room to linger (every slot an
// authenticated session, rejectLingerMax refused ones already kept open) still ran its TLS
// handshake, with two goroutines, for up to AuthTimeout: a flood beyond MaxConns held a file
// descriptor and two goroutines per connection, without bound. gnet closes such a connection
// at once; so does TLS now.
func TestServerTLSRefusedBeyondLingerClosedAtOnce(t *testing.T) {
	serverTLS, clientTLS := testkit.TLSConfigs(t)
	const maxConns = 4
	env := startServer(t, func(cfg *Config) {
		cfg.TLS = serverTLS
		cfg.MaxConns = maxConns
		cfg.AuthTimeout = 10 * srvTestTimeout // only the fix closes them within the test
	})
	for i := range maxConns {
		env.dial(uint64(1+i), func(cfg *sgio.ClientConfig) { cfg.TLS = clientTLS })
	}
	var lingering []net.Conn
	defer func() {
		for _, c := range lingering {
			_ = c.Close()
		}
	}()
	for range rejectLingerMax {
		c, err := net.DialTimeout("tcp", env.addr, srvTestTimeout)
		require.NoError(t, err)
		lingering = append(lingering, c)
	}
	const beyond = 8
	for i := range beyond {
		c, err := net.DialTimeout("tcp", env.addr, srvTestTimeout)
		require.NoError(t, err)
		_ = c.SetReadDeadline(time.Now().Add(srvTestTimeout))
		_, err = c.Read(make([]byte, 1))
		_ = c.Close()
		require.True(t, errors.Is(err, io.EOF) || isReset(err), "connection %d beyond the lingering ones: %v", i, err)
	}
	require.Equal(t, uint64(rejectLingerMax+beyond), env.srv.Stats().ConnsRejected)
}

// Found in review: the bytes of slow-path reads waiting for room (reserveRoom) were not
// bounded: over TLS, while one large reply's write is stalled by a client that does not
// read, the reader goes on reading (nothing is pending) and every ReadPages it parses (up
// to MaxBody each) waits on a goroutine, up to MaxInflight of them: 1024 x 16 MiB. They now
// count against MaxQueuedBytes and MaxQueuedBytesTotal, as queued commits do: beyond, ErrBusy
// before the body is parsed.
func TestServerStalledReadsBounded(t *testing.T) {
	serverTLS, clientTLS := testkit.TLSConfigs(t)
	const maxQueued = 16 << 20
	env := startServer(t, func(cfg *Config) {
		cfg.TLS = serverTLS
		cfg.WriteTimeout = 10 * srvTestTimeout // the stall lasts the test
		cfg.MaxQueuedBytes = maxQueued
		cfg.Options.CacheBytes = 64 << 20
	})
	c := env.dial(9, func(cfg *sgio.ClientConfig) { cfg.TLS = clientTLS })
	ti, g := srvTable(t, c, "stalled", 9)
	seq := g.LastSeq
	const pages = 3800 // a reply of 15 MiB: alone under connReplyMaxBytes
	fillPages(t, c, ti.Table, 9, g.Epoch, &seq, pages)

	r := dialSlowTLS(t, env, clientTLS, 32<<20)
	r.handshake(10)
	sess := env.sessionOf(t, 10)

	big := make([]base.PageWant, pages)
	for i := range big {
		big[i] = base.PageWant{Table: ti.Table, Page: uint64(i), Want: ^uint64(0)}
	}
	r.send(100, &sgio.ReadPages{Wants: big}) // and never read
	waitFor(t, "the large reply's write stalls", func() bool {
		sess.mu.Lock()
		defer sess.mu.Unlock()
		return sess.busy && sess.sending.Len() > 14<<20
	})
	// Reads of empty pages with large bodies (1 MiB each): their replies (1.3 MiB) find no
	// room, so they wait, parsed.
	empty := make([]base.PageWant, 40000)
	for i := range empty {
		empty[i] = base.PageWant{Table: ti.Table, Page: uint64(pages + i), Want: ^uint64(0)}
	}
	req := &sgio.ReadPages{Wants: empty}
	var frame []byte
	busyBefore := env.srv.Stats().BusyReplies
	for i := range 3 * maxQueued / (sgio.HeaderSize + req.BodySize()) {
		frame = sgio.AppendFrame(frame[:0], uint64(200+i), req)
		r.write(frame)
	}
	waitFor(t, "reads beyond MaxQueuedBytes refused", func() bool { return env.srv.Stats().BusyReplies > busyBefore })
	sess.mu.Lock()
	queued := sess.queuedBytes
	sess.mu.Unlock()
	require.LessOrEqual(t, queued, int64(maxQueued))
	require.NoError(t, c.CallInto(srvCtx(t), &sgio.Ping{}, &sgio.Pong{}))
}

// dialSlowTLS dials env over TLS with a 4 KiB socket read buffer (a client that reads
// slowly: the server's writes to it stall soon), closed at the test's end; maxBody is the
// reply limit its Hello announces (1 MiB when 0). Not yet handshaken.
func dialSlowTLS(t *testing.T, env *srvEnv, clientTLS *tls.Config, maxBody uint32) *rawClient {
	t.Helper()
	raw, err := net.DialTimeout("tcp", env.addr, srvTestTimeout)
	require.NoError(t, err)
	require.NoError(t, raw.(*net.TCPConn).SetReadBuffer(4096))
	t.Cleanup(func() { _ = raw.Close() })
	ctls := clientTLS.Clone()
	ctls.ServerName = "127.0.0.1"
	tc := tls.Client(raw, ctls)
	_ = tc.SetDeadline(time.Now().Add(srvTestTimeout))
	return &rawClient{t: t, conn: tc, br: newBytesReader(tc), nonce: sgio.NewNonce(), maxBody: maxBody}
}
