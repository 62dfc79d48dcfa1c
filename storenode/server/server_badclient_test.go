package server

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/checksum"
	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/internal/testkit"
	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/sgio"
)

// Clients that misbehave: each is refused or closed with a log line saying why, while a
// bystander on the same server keeps being served, and nothing leaks (startServer checks
// goroutines once the server has stopped).

// bystander dials a well-behaved client and returns a check that it is still served.
func (env *srvEnv) bystander() func() {
	c := env.dial(99)
	return func() {
		env.t.Helper()
		require.NoError(env.t, c.CallInto(srvCtx(env.t), &sgio.Ping{}, &sgio.Pong{}))
	}
}

// rawHeader is a frame header with the given body length and a CRC over the header only.
func rawHeader(t sgio.Type, id uint64, bodyLen uint32) []byte {
	h := make([]byte, sgio.HeaderSize)
	binary.LittleEndian.PutUint32(h[0:], sgio.Magic)
	h[4] = sgio.Version
	h[5] = byte(t)
	binary.LittleEndian.PutUint64(h[8:], id)
	binary.LittleEndian.PutUint32(h[16:], bodyLen)
	return h
}

// rawFrame is a frame of any type and body (padded to 8 bytes), with a valid CRC.
func rawFrame(t sgio.Type, id uint64, body []byte) []byte {
	for len(body)%8 != 0 {
		body = append(body, 0)
	}
	f := append(rawHeader(t, id, uint32(len(body))), body...)
	binary.LittleEndian.PutUint32(f[20:], frameCRC(f))
	return f
}

// frameCRC computes a frame's CRC32C: header bytes 0..19, then the body.
func frameCRC(f []byte) uint32 { return checksum.Update(checksum.Of(f[:20]), f[sgio.HeaderSize:]) }

func TestServerBadClients(t *testing.T) {
	t.Run("4GiB-length-header", func(t *testing.T) {
		env := startServer(t)
		served := env.bystander()
		for _, authed := range []bool{false, true} {
			r := dialRaw(t, env.addr)
			if authed {
				r.handshake(7)
			}
			start := time.Now()
			r.write(rawHeader(sgio.TypeCommit, 42, 0xffffffff))
			r.expectError(42, sgio.ErrFrameTooLarge)
			r.expectClosed()
			require.Less(t, time.Since(start), 2*time.Second, "rejected at once, without waiting for the body")
		}
		served()
		require.Contains(t, env.logs.String(), "frame too large")
		require.GreaterOrEqual(t, env.srv.Stats().RejectedFrames, uint64(2))
	})

	t.Run("bad-magic-and-checksum", func(t *testing.T) {
		env := startServer(t)
		served := env.bystander()
		r := dialRaw(t, env.addr)
		r.handshake(7)
		f := sgio.AppendFrame(nil, 5, &sgio.Ping{})
		f[0] = 'X'
		r.write(f)
		r.expectError(5, corrupt.ErrCorruption)
		r.expectClosed()

		r = dialRaw(t, env.addr)
		r.handshake(7)
		f = sgio.AppendFrame(nil, 6, &sgio.OpenTable{Name: "x"})
		f[len(f)-1] ^= 1
		r.write(f)
		r.expectError(6, corrupt.ErrCorruption) // ErrChecksum travels as CodeCorruption
		r.expectClosed()
		served()
		require.Contains(t, env.logs.String(), "bad frame")
	})

	t.Run("requests-before-auth", func(t *testing.T) {
		env := startServer(t)
		served := env.bystander()
		r := dialRaw(t, env.addr)
		r.send(3, &sgio.Ping{})
		r.expectError(3, sgio.ErrAuthFailed)
		r.expectClosed()

		r = dialRaw(t, env.addr)
		r.hello(7)
		r.send(4, &sgio.OpenTable{Name: "x"}) // skipping Auth
		r.expectError(4, sgio.ErrAuthFailed)
		r.expectClosed()
		served()
		require.Contains(t, env.logs.String(), "request before authentication")
	})

	t.Run("unknown-type-and-malformed-body", func(t *testing.T) {
		env := startServer(t)
		r := dialRaw(t, env.addr)
		r.handshake(7)
		r.write(rawFrame(0x7e, 9, nil))
		r.expectError(9, sgio.ErrUnsupported)
		body := make([]byte, 24)
		body[4] = 1 // Acquire's reserved field
		r.write(rawFrame(sgio.TypeAcquire, 10, body))
		r.expectError(10, sgio.ErrMalformed)
		// The stream is intact: the session goes on.
		r.send(11, &sgio.Ping{})
		f := r.read()
		require.Equal(t, sgio.TypePong, f.Type)
		require.Equal(t, uint64(11), f.ID)
	})

	t.Run("silent-client", func(t *testing.T) {
		const authTimeout = 300 * time.Millisecond
		env := startServer(t, func(cfg *Config) { cfg.AuthTimeout = authTimeout })
		served := env.bystander()
		start := time.Now()
		r := dialRaw(t, env.addr)
		r.expectClosed()
		require.GreaterOrEqual(t, time.Since(start), authTimeout)
		require.Less(t, time.Since(start), authTimeout+3*time.Second)
		served()
		require.Contains(t, env.logs.String(), "no authentication within 300ms")
		require.Equal(t, uint64(1), env.srv.Stats().AuthTimeouts)
	})

	t.Run("one-byte-at-a-time", func(t *testing.T) {
		// A client that trickles its Hello, a byte every 100ms, is closed at the auth deadline
		// although it keeps sending: the deadline counts from the connection's start.
		const authTimeout = time.Second
		env := startServer(t, func(cfg *Config) { cfg.AuthTimeout = authTimeout })
		served := env.bystander()
		start := time.Now()
		r := dialRaw(t, env.addr)
		hello := sgio.AppendFrame(nil, 0, &sgio.Hello{Version: sgio.Version, MaxBody: 1 << 20, OwnerID: 7, Nonce: r.nonce})
		stop := make(chan struct{})
		trickled := make(chan int, 1)
		go func() {
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			i := 0
			defer func() { trickled <- i }()
			for ; i < len(hello); i++ {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				if _, err := r.conn.Write(hello[i : i+1]); err != nil {
					return
				}
			}
		}()
		r.expectClosed()
		close(stop)
		sent := <-trickled
		elapsed := time.Since(start)
		require.GreaterOrEqual(t, elapsed, authTimeout)
		require.Less(t, elapsed, authTimeout+3*time.Second)
		require.Less(t, sent, len(hello), "the Hello never completed")
		served()
		require.Contains(t, env.logs.String(), "no authentication within 1s")
	})

	t.Run("too-many-connections", func(t *testing.T) {
		env := startServer(t, func(cfg *Config) { cfg.MaxConns = 2 })
		env.watchCloses()
		a := env.dial(1)
		_ = env.dial(2)
		_, err := env.tryDial(3)
		require.ErrorIs(t, err, sgio.ErrBusy)
		env.waitClosed(1)
		require.Contains(t, env.logs.String(), "connection refused")
		require.Equal(t, uint64(1), env.srv.Stats().ConnsRejected)
		// Room again once a connection closes.
		require.NoError(t, a.Close())
		env.waitClosed(1)
		c := env.dial(3)
		require.NoError(t, c.CallInto(srvCtx(t), &sgio.Ping{}, &sgio.Pong{}))
	})

	t.Run("in-flight-bound", func(t *testing.T) {
		dir := coldPage(t)
		gfs := &gateFS{FS: vfs.Default}
		env := startServer(t, func(cfg *Config) {
			cfg.Options.Dir, cfg.Options.FS = dir, gfs
			cfg.MaxInflight = 4
		})
		served := env.bystander()
		r := dialRaw(t, env.addr)
		hr := r.handshake(7)
		require.Equal(t, uint32(4), hr.MaxInflight)
		release := gfs.hold()
		defer gfs.open(release)
		for id := uint64(10); id < 14; id++ {
			r.send(id, &sgio.ReadPages{Wants: []base.PageWant{{Table: coldTable, Page: 0, Want: 2}}})
		}
		<-gfs.entered
		r.send(20, &sgio.Stats{})
		r.expectError(20, sgio.ErrBusy)
		// Ping needs no goroutine and is answered inline, even now.
		r.send(21, &sgio.Ping{})
		require.Equal(t, sgio.TypePong, r.read().Type)
		gfs.open(release)
		for range 4 {
			f := r.read()
			require.Equal(t, sgio.TypeSegments, f.Type)
		}
		r.send(22, &sgio.Stats{})
		require.Equal(t, sgio.TypeStatsReply, r.read().Type)
		served()
		require.Equal(t, uint64(1), env.srv.Stats().BusyReplies)
	})

	t.Run("disconnect-mid-commit", func(t *testing.T) {
		env := startServer(t)
		env.watchCloses()
		served := env.bystander()
		c := env.dial(7)
		ti, g := srvTable(t, c, "cut", 7)
		full := sgio.AppendFrame(nil, 5, srvCommit(ti.Table, 7, g.Epoch, 1, []uint64{1}, 1))
		// The raw connections below are the same incarnation (all zero) as c: each one's
		// handshake replaces the connection before it, so c goes first and comes back last.
		require.NoError(t, c.Close())
		env.waitClosed(1)

		// Half a frame, then gone.
		r := dialRaw(t, env.addr)
		r.handshake(7)
		r.write(full[:len(full)/2])
		require.NoError(t, r.conn.Close())
		env.waitClosed(1)

		// A whole commit, then gone before the ack.
		r = dialRaw(t, env.addr)
		r.handshake(7)
		r.write(full)
		require.NoError(t, r.conn.Close())
		env.waitClosed(1)

		// A commit that waits in the engine (for seq 2, a gap in the owner's seqs) when the
		// client goes.
		r = dialRaw(t, env.addr)
		r.handshake(7)
		r.write(sgio.AppendFrame(nil, 6, srvCommit(ti.Table, 7, g.Epoch, 3, []uint64{2}, 3)))
		require.NoError(t, r.conn.Close())
		env.waitClosed(1)

		// The owner goes on from where the store is: batch 1 applied once; batch 3 applied
		// in seq order once batch 2 fills the gap, before batch 4 (whose ack proves it).
		c = env.dial(7)
		var again sgio.Grant
		require.NoError(t, c.CallInto(srvCtx(t), &sgio.Acquire{Table: ti.Table, Owner: 7, Epoch: g.Epoch}, &again))
		require.Equal(t, uint64(1), again.LastSeq)
		require.NoError(t, c.CallInto(srvCtx(t), srvCommit(ti.Table, 7, g.Epoch, 2, []uint64{2, 3}, 2), &sgio.CommitAck{}))
		require.NoError(t, c.CallInto(srvCtx(t), srvCommit(ti.Table, 7, g.Epoch, 4, []uint64{4}, 4), &sgio.CommitAck{}))
		for id, want := range map[uint64]uint64{1: 1, 2: 3, 3: 2, 4: 4} {
			row, ok := srvReadRow(t, c, ti.Table, id)
			require.True(t, ok)
			require.Equal(t, testkit.Row64(want), row, "row %d", id)
		}
		st := env.srv.Engine().Stats()
		require.Equal(t, uint64(4), st.Commits)
		served()
		// Shutdown waits for the requests of the closed sessions too.
		ctx, cancel := context.WithTimeout(context.Background(), srvTestTimeout)
		defer cancel()
		require.NoError(t, env.srv.Shutdown(ctx))
		require.Zero(t, env.srv.Stats().InFlight)
		require.Contains(t, env.logs.String(), "connection closed")
	})

	t.Run("idle-session", func(t *testing.T) {
		env := startServer(t, func(cfg *Config) { cfg.IdleTimeout = 300 * time.Millisecond })
		c := env.dial(1)
		select {
		case <-c.Done():
		case <-time.After(srvTestTimeout):
			t.Fatal("idle session not closed")
		}
		require.ErrorIs(t, c.Err(), sgio.ErrConnClosed)
		require.Contains(t, env.logs.String(), "idle for 300ms")
		require.Equal(t, uint64(1), env.srv.Stats().IdleCloses)
	})
}

// coldPage returns a store directory whose table "cold" (the store's first table, id
// coldTable) has row 1 on disk: a read of it after a reopen misses the cache and reads the
// data file.
const coldTable = 1

func coldPage(t *testing.T) string {
	dir := t.TempDir()
	env := startServer(t, func(cfg *Config) { cfg.Options.Dir = dir })
	c := env.dial(1)
	ti, g := srvTable(t, c, "cold", 1)
	require.Equal(t, uint32(coldTable), ti.Table)
	require.NoError(t, c.CallInto(srvCtx(t), srvCommit(ti.Table, 1, g.Epoch, 1, []uint64{1}, 11), &sgio.CommitAck{}))
	require.NoError(t, c.Close())
	env.stop()
	return dir
}
