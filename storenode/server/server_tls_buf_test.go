package server

import (
	"crypto/tls"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/testkit"
	"github.com/weftdb/weft/sgio"
)

// A TLS client that declares a MaxBody frame and sends only 8 KiB of it pins no more than
// its bytes, times two: the reader's buffer doubles as bytes arrive (4 KiB, 8 KiB, 16 KiB),
// bounded by what the header declares. Fails on 35ab947: the first growth allocated the whole
// declared frame (16 MiB) before its body arrived, for every such connection.
func TestTLSReadBufferGrowsWithArrivals(t *testing.T) {
	grown := make(chan int, 64)
	tlsReadBufGrown = func(c int) {
		select {
		case grown <- c:
		default:
		}
	}
	t.Cleanup(func() { tlsReadBufGrown = nil }) // after the server's stop (cleanups run last first)
	serverTLS, clientTLS := testkit.TLSConfigs(t)
	env := startServer(t, func(cfg *Config) { cfg.TLS = serverTLS })
	maxBody := env.srv.cfg.MaxBody
	require.GreaterOrEqual(t, maxBody, uint32(1<<20))

	conn, err := tls.Dial("tcp", env.addr, clientTLS)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(srvTestTimeout))
	raw := &rawClient{t: t, conn: conn, br: newBytesReader(conn), nonce: sgio.NewNonce()}
	raw.handshake(5)

	const sent = 8 << 10
	raw.write(append(rawHeader(sgio.TypeCommit, 9, maxBody), make([]byte, sent)...))
	biggest := 0
	for biggest < sgio.HeaderSize+sent {
		select {
		case c := <-grown:
			require.LessOrEqual(t, c, 4*(sgio.HeaderSize+sent), "the buffer grew ahead of the bytes that arrived")
			biggest = max(biggest, c)
		case <-time.After(srvTestTimeout):
			t.Fatalf("the reader did not take the %d bytes sent within %v", sent, srvTestTimeout)
		}
	}
	require.Equal(t, 16<<10, biggest)

	// The reader still takes the rest of the frame: it reads it whole, then refuses it (the
	// header's checksum was left zero) and closes the connection.
	raw.write(make([]byte, int(maxBody)-sent))
	f := raw.read()
	require.Equal(t, sgio.TypeError, f.Type)
	require.Equal(t, uint64(9), f.ID)
	raw.expectClosed()
}
