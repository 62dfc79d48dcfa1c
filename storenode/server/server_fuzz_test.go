package server

import (
	"context"
	"errors"
	"runtime/debug"
	"sync"
	"testing"
	"time"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// FuzzServerInbound feeds arbitrary bytes, after a valid handshake, to the function the server
// uses for every connection's inbound bytes (session.inbound, which gnet's OnTraffic and the
// TLS reader call), over a real engine. The input's first byte picks how the rest is read:
//
//	bit 0 = 0   raw bytes, as they would come off the socket
//	bit 0 = 1   records [type u8][body length/8 u8][body], each sent as a frame with a valid
//	            header and CRC, so the message parsers and the engine get to see the bodies
//	bits 1..7   the size of the chunks the stream arrives in (0: all at once)
//
// Whatever the input, the server must not panic, every byte it writes must be a whole, valid
// reply frame, and every request it took must be answered (Shutdown's wait ends).
func FuzzServerInbound(f *testing.F) {
	e, err := storenode.Open(storenode.Options{Dir: f.TempDir(), Sync: storenode.SyncNone, CacheBytes: 1 << 20, SeqGapWait: 5 * time.Millisecond,
		CheckpointInterval: -1, Logger: quietLogger})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { e.Close() })
	ti, err := e.CreateTable("fuzz", 64)
	if err != nil {
		f.Fatal(err)
	}
	g, err := e.Acquire(ti.ID, fuzzOwner, 0)
	if err != nil {
		f.Fatal(err)
	}

	framed := func(chunk byte, ms ...sgio.Message) []byte {
		in := []byte{1 | chunk<<1}
		for _, m := range ms {
			body := m.AppendBody(nil)
			in = append(in, byte(m.Type()), byte(len(body)/8))
			in = append(in, body...)
		}
		return in
	}
	raw := func(chunk byte, frames ...[]byte) []byte {
		in := []byte{chunk << 1}
		for _, fr := range frames {
			in = append(in, fr...)
		}
		return in
	}
	commit := srvCommit(ti.ID, fuzzOwner, g.Epoch, 1, []uint64{1, 2, 70}, 5)
	read := &sgio.ReadPages{Wants: []base.PageWant{{Table: ti.ID, Page: 0, Want: 0xff}, {Table: ti.ID, Page: 1, Want: 0x40}}}
	f.Add(framed(0, &sgio.Ping{}, &sgio.Stats{}, &sgio.ListTables{}))
	f.Add(framed(3, commit, read, &sgio.PageDir{Table: ti.ID, Hi: 10}))
	f.Add(framed(0, &sgio.Acquire{Table: ti.ID, Owner: fuzzOwner, Epoch: g.Epoch}, &sgio.AllocIDs{Table: ti.ID, Owner: fuzzOwner, Epoch: g.Epoch, Pages: 1}))
	f.Add(framed(1, &sgio.CreateTable{Name: "t2", RowBytes: 8}, &sgio.OpenTable{Name: "t2"}, &sgio.DropTable{Name: "t2"}))
	f.Add(framed(0, &sgio.Hello{Version: 1, MaxBody: 4096}, &sgio.Auth{}))
	f.Add(raw(0, sgio.AppendFrame(nil, 7, commit), sgio.AppendFrame(nil, 8, read)))
	f.Add(raw(5, sgio.AppendFrame(nil, 9, &sgio.Ping{})))
	f.Add(raw(0, rawHeader(sgio.TypeCommit, 1, 0xffffffff)))
	f.Add(raw(0, rawFrame(0x7e, 3, []byte("unknown type")), sgio.AppendFrame(nil, 4, &sgio.Ping{})))
	f.Add(raw(0, []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")))
	f.Add(raw(2, sgio.AppendFrame(nil, 10, commit)[:40]))
	prep := &sgio.TxnPrepare{Txn: [16]byte{1}, Lease: 5, Commit: *srvCommit(ti.ID, fuzzOwner, g.Epoch, 2, []uint64{3}, 6)}
	f.Add(framed(0, prep, &sgio.TxnDecide{Txn: [16]byte{1}, Lease: 5, Decision: sgio.TxnCommit, Count: 1},
		&sgio.TxnApply{Txn: [16]byte{1}, Decision: sgio.TxnCommit}, &sgio.TxnAsk{Txn: [16]byte{1}, Lease: 5},
		&sgio.TxnReport{Txn: [16]byte{1}, Index: 0}))

	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) == 0 {
			return
		}
		mode, data := in[0], in[1:]
		stream := data
		if mode&1 == 1 {
			stream = fuzzFrames(data)
		}
		chunk := int(mode >> 1)
		if chunk == 0 {
			chunk = len(stream) + 1
		}

		watchdog := time.AfterFunc(10*time.Second, func() {
			debug.SetTraceback("all")
			panic("FuzzServerInbound: one input took 10s")
		})
		defer watchdog.Stop()
		srv, err := New(Config{Engine: e, Listen: "127.0.0.1:0", Logger: quietLogger, MaxInflight: 16,
			MaxBody: 64 << 10, IdleTimeout: -1})
		if err != nil {
			t.Fatal(err)
		}
		tr := &fuzzTransport{}
		sess := srv.newSession(tr, "fuzz")
		fuzzHandshake(t, sess, tr)

		var buf []byte
		closed := false
		for off := 0; off < len(stream) && !closed; off += chunk {
			buf = append(buf, stream[off:min(off+chunk, len(stream))]...)
			var n int
			n, closed = sess.inbound(buf)
			if n > len(buf) {
				t.Fatalf("consumed %d of %d bytes", n, len(buf))
			}
			buf = buf[n:]
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := srv.requests.drain(ctx); err != nil {
			t.Fatalf("requests still in flight: %d", srv.requests.count())
		}
		sess.closed(nil)
		srv.workers.Wait()
		if err := tr.check(); err != nil {
			t.Fatal(err)
		}
	})
}

const fuzzOwner = 3

// fuzzFrames turns records [type][body length/8][body] into frames with valid headers.
func fuzzFrames(data []byte) []byte {
	var out []byte
	for id := uint64(100); len(data) >= 2; id++ {
		t, n := sgio.Type(data[0]), int(data[1])*8
		data = data[2:]
		n = min(n, len(data)&^7)
		out = append(out, rawFrame(t, id, data[:n])...)
		data = data[n:]
	}
	return out
}

// fuzzHandshake runs Hello and Auth through inbound, as a client would.
func fuzzHandshake(t *testing.T, sess *session, tr *fuzzTransport) {
	nonce := sgio.NewNonce()
	hello := sgio.Hello{Version: sgio.Version, MaxBody: 1 << 20, OwnerID: fuzzOwner, Nonce: nonce}
	in := sgio.AppendFrame(nil, 0, &hello)
	if n, closed := sess.inbound(in); n != len(in) || closed {
		t.Fatalf("Hello: consumed %d of %d, closed %v", n, len(in), closed)
	}
	frames, err := tr.frames()
	if err != nil || len(frames) != 1 || frames[0].Type != sgio.TypeHelloReply {
		t.Fatalf("Hello answered with %v, %v", frames, err)
	}
	var hr sgio.HelloReply
	if err := hr.Parse(frames[0].Body); err != nil {
		t.Fatal(err)
	}
	in = sgio.AppendFrame(nil, 1, &sgio.Auth{Proof: sgio.ClientProof(nil, hr.Nonce, nonce, sgio.Transcript(&hello, &hr))})
	if n, closed := sess.inbound(in); n != len(in) || closed {
		t.Fatalf("Auth: consumed %d of %d, closed %v", n, len(in), closed)
	}
	if frames, err = tr.frames(); err != nil || len(frames) != 2 || frames[1].Type != sgio.TypeAuthOK {
		t.Fatalf("Auth answered with %v, %v", frames, err)
	}
}

// fuzzTransport records what the server writes.
type fuzzTransport struct {
	mu  sync.Mutex
	out []byte
}

func (f *fuzzTransport) writeLoop(bufs [][]byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, b := range bufs {
		f.out = append(f.out, b...)
	}
	return nil
}

func (f *fuzzTransport) writeAsync(bufs [][]byte, done func(error)) error {
	err := f.writeLoop(bufs)
	go done(err)
	return nil
}

func (f *fuzzTransport) close() {}

func (f *fuzzTransport) wake() {}

// frames decodes everything written so far.
func (f *fuzzTransport) frames() ([]sgio.Frame, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var fs []sgio.Frame
	for b := f.out; len(b) > 0; {
		fr, n, err := sgio.Decode(b, sgio.MaxBodyLimit)
		if err != nil {
			return fs, err
		}
		fs = append(fs, fr)
		b = b[n:]
	}
	return fs, nil
}

// check verifies that the server wrote whole, valid reply frames only.
func (f *fuzzTransport) check() error {
	fs, err := f.frames()
	if err != nil {
		return err
	}
	for _, fr := range fs {
		if fr.Type.IsRequest() {
			return errors.New("the server sent a request type")
		}
		if err := sgio.NewMessage(fr.Type).Parse(fr.Body); err != nil {
			return err
		}
	}
	return nil
}
