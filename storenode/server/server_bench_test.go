package server

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/checksum"
	"github.com/weftdb/weft/internal/testkit"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// Benchmarks of the server over loopback TCP, each beside a baseline measured by the same
// client code in the same run: a plain net.Conn server that answers every request frame at
// once with a reply frame of the size the storage node would send (no engine, no gnet). The
// ratio of the two is the server's overhead over what the network stack and the client cost.
//
//	go test ./storenode -run '^$' -bench 'BenchmarkServer' -count 6
//
// Sub-benchmarks are named server=weft|echo, so benchstat can compare them.

// The servers run in child processes (this test binary, re-executed: TestServerBenchHelper),
// as a storage node does: in the benchmark's own process, gnet's event loops would sit in
// epoll_wait holding the runtime's Ps, and the client's goroutines would wait for the runtime
// to take them back (tens of microseconds per round trip that no deployment pays).

const (
	benchHelperEnv = "WEFT_SERVER_BENCH_HELPER" // weft or echo
	benchSyncEnv   = "WEFT_SERVER_BENCH_SYNC"
	benchDirEnv    = "WEFT_SERVER_BENCH_DIR"
	// benchProfileEnv, set by whoever runs the benchmarks, names a file for the storage
	// node process's CPU profile (the last server process started overwrites it).
	benchProfileEnv = "WEFT_SERVER_BENCH_CPUPROFILE"
)

// TestServerBenchHelper is a benchmark's server process; it skips unless run as one. It
// serves until its stdin closes.
func TestServerBenchHelper(t *testing.T) {
	kind := testkit.HelperSpec(t, benchHelperEnv, "the server benchmarks")
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	announce := func(addr net.Addr) { fmt.Printf("%s%s\n", srvAddrPrefix, addr) }
	if kind == "echo" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		announce(ln.Addr())
		go func() {
			<-ctx.Done()
			_ = ln.Close()
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go echoConn(c)
		}
	}
	if prof := os.Getenv(benchProfileEnv); prof != "" {
		f, err := os.Create(prof)
		if err != nil {
			t.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			t.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	mode, _ := storenode.ParseSyncMode(os.Getenv(benchSyncEnv))
	err := Serve(ctx, Config{
		Listen:   "127.0.0.1:0",
		Logger:   quietLogger,
		OnListen: announce,
		Options: storenode.Options{Dir: os.Getenv(benchDirEnv), Sync: mode, CacheBytes: 256 << 20, CheckpointInterval: -1,
			Logger: quietLogger},
	})
	if err != nil {
		t.Fatal(err)
	}
}

// benchServer starts a server process, weft or echo, and returns its address.
func benchServer(b *testing.B, kind string, mode storenode.SyncMode) string {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestServerBenchHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), benchHelperEnv+"="+kind, benchSyncEnv+"="+mode.String(), benchDirEnv+"="+b.TempDir())
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = stdin.Close() // a graceful stop
		_ = cmd.Wait()
	})
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if a, ok := strings.CutPrefix(sc.Text(), srvAddrPrefix); ok {
			go func() { _, _ = io.Copy(io.Discard, stdout) }()
			return a
		}
	}
	b.Fatalf("server process exited before listening")
	return ""
}

// echoReplies are the baseline's answers, by request type: frames of the sizes the storage
// node sends (its request id and CRC fixed up per reply).
var echoReplies = func() map[sgio.Type][]byte {
	m := map[sgio.Type]sgio.Message{
		sgio.TypePing:        &sgio.Pong{},
		sgio.TypeCreateTable: &sgio.TableInfo{Table: 1, RowBytes: 64, Name: "bench"},
		sgio.TypeAcquire:     &sgio.Grant{Table: 1, Owner: 1, Epoch: 1},
		sgio.TypeAllocIDs:    &sgio.IDRange{Count: 64},
		sgio.TypeCommit:      &sgio.CommitAck{LSN: 1, Seq: 1},
		sgio.TypeReadPages:   &sgio.Segments{Segments: []base.Segment{{Table: 1, RowBytes: 64, Data: 1 << 1, Rows: make([]byte, 64)}}},
	}
	out := map[sgio.Type][]byte{}
	for t, msg := range m {
		out[t] = sgio.AppendFrame(nil, 0, msg)
	}
	return out
}()

// echoConn is the baseline server of one connection: for each request frame it writes the
// reply frame at once, flushing when no more input is buffered, so the replies to a
// pipelined burst go out together, as the storage node's do.
func echoConn(c net.Conn) {
	defer c.Close()
	br := sgio.NewFrameReader(c, sgio.MaxBodyLimit)
	bw := bufio.NewWriterSize(c, 64<<10)
	var clientNonce, serverNonce [sgio.NonceSize]byte
	var transcript [sgio.TranscriptSize]byte
	for {
		f, n, err := sgio.ReadFrame(br, sgio.MaxBodyLimit)
		if err != nil {
			return
		}
		var out []byte
		if f.Type == sgio.TypeHello { // the handshake, with an empty secret
			var hello sgio.Hello
			if hello.Parse(f.Body) != nil {
				return
			}
			hr := sgio.HelloReply{Version: sgio.Version, MaxBody: sgio.MaxBodyLimit, MaxInflight: 4096, LeaseMillis: 1000,
				Nonce: sgio.NewNonce()}
			clientNonce, serverNonce, transcript = hello.Nonce, hr.Nonce, sgio.Transcript(&hello, &hr)
			out = sgio.AppendFrame(nil, f.ID, &hr)
		} else if f.Type == sgio.TypeAuth {
			out = sgio.AppendFrame(nil, f.ID, &sgio.AuthOK{Proof: sgio.ServerProof(nil, clientNonce, serverNonce, transcript)})
		} else if tmpl := echoReplies[f.Type]; tmpl != nil {
			out = bw.AvailableBuffer()[:0]
			out = append(out, tmpl...)
			binary.LittleEndian.PutUint64(out[8:], f.ID)
			binary.LittleEndian.PutUint32(out[20:], checksum.Update(checksum.Of(out[:20]), out[sgio.HeaderSize:]))
		} else {
			return
		}
		_, _ = bw.Write(out)
		_, _ = br.Discard(n)
		if br.Buffered() == 0 && bw.Flush() != nil {
			return
		}
	}
}

// benchTable creates a table over c (the echo server fakes it) and acquires it for owner.
func benchTable(b *testing.B, c *sgio.Client, name string, owner uint64) (uint32, uint64) {
	b.Helper()
	ctx := context.Background()
	var ti sgio.TableInfo
	if err := c.CallInto(ctx, &sgio.CreateTable{Name: name, RowBytes: 64}, &ti); err != nil {
		b.Fatal(err)
	}
	var g sgio.Grant
	if err := c.CallInto(ctx, &sgio.Acquire{Table: ti.Table, Owner: owner}, &g); err != nil {
		b.Fatal(err)
	}
	if err := c.CallInto(ctx, &sgio.AllocIDs{Table: ti.Table, Owner: owner, Epoch: g.Epoch, Pages: 1}, &sgio.IDRange{}); err != nil {
		b.Fatal(err)
	}
	return ti.Table, g.Epoch
}

func benchDial(b *testing.B, addr string, owner uint64) *sgio.Client {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := sgio.Dial(ctx, sgio.ClientConfig{Addr: addr, OwnerID: owner})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close() })
	return c
}

// pipeline sends msg b.N times on c with up to depth requests in flight and reports
// round trips per second.
func pipeline(b *testing.B, c *sgio.Client, msg sgio.Message, depth int) {
	slots := make(chan struct{}, depth)
	var failed error
	var mu sync.Mutex
	done := func(_ sgio.Frame, err error) {
		if err != nil {
			mu.Lock()
			failed = err
			mu.Unlock()
		}
		<-slots
	}
	ctx := context.Background()
	b.ReportAllocs()
	start := time.Now()
	for b.Loop() {
		slots <- struct{}{}
		if err := c.Send(ctx, msg, done); err != nil {
			b.Fatal(err)
		}
	}
	for range depth {
		slots <- struct{}{}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "ops/s")
	if failed != nil {
		b.Fatal(failed)
	}
}

// BenchmarkServerRoundTrip: round trips per second on one connection with 1, 16 and 128
// requests in flight, for Ping and for a read of one 64-byte row (a cache hit).
func BenchmarkServerRoundTrip(b *testing.B) {
	for _, op := range []string{"ping", "read1"} {
		for _, depth := range []int{1, 16, 128} {
			for _, server := range []string{"weft", "echo"} {
				b.Run(fmt.Sprintf("op=%s/depth=%d/server=%s", op, depth, server), func(b *testing.B) {
					c := benchDial(b, benchServer(b, server, storenode.SyncNone), 1)
					var msg sgio.Message = &sgio.Ping{}
					if op == "read1" {
						table, epoch := benchTable(b, c, "bench", 1)
						commit := &sgio.Commit{Owner: 1, Seq: 1, Fences: []base.Fence{{Table: table, Epoch: epoch}},
							Segments: []base.Segment{{Table: table, RowBytes: 64, Page: 0, Data: 1 << 1, Rows: testkit.Row64(1)}}}
						if _, err := c.Call(context.Background(), commit); err != nil {
							b.Fatal(err)
						}
						msg = &sgio.ReadPages{Wants: []base.PageWant{{Table: table, Page: 0, Want: 1 << 1}}}
					}
					pipeline(b, c, msg, depth)
				})
			}
		}
	}
}

// BenchmarkServerCommit: one-row commits from 128 concurrent committers, per sync mode: with
// conns=128 each committer is an owner with its own connection and table and one commit in
// flight; with conns=1 they share one owner and connection, taking seqs in order and
// pipelining (as a transaction node's commit pipeline does, without merging batches). Reports
// rows/s and the bytes on the wire per commit (request and reply frames).
func BenchmarkServerCommit(b *testing.B) {
	const committers = 128
	for _, mode := range []storenode.SyncMode{storenode.SyncNone, storenode.SyncAlways} {
		for _, conns := range []int{128, 1} {
			for _, server := range []string{"weft", "echo"} {
				b.Run(fmt.Sprintf("sync=%s/committers=%d/conns=%d/server=%s", mode, committers, conns, server), func(b *testing.B) {
					benchCommit(b, benchServer(b, server, mode), committers, conns, server == "weft")
				})
			}
		}
	}
}

// srvBenchOwner is one owner of the commit benchmark: its connection, table and next seq.
type srvBenchOwner struct {
	mu     sync.Mutex // orders Send calls by seq
	c      *sgio.Client
	commit sgio.Commit
}

func benchCommit(b *testing.B, addr string, committers, conns int, weft bool) {
	owners := make([]*srvBenchOwner, conns)
	for i := range owners {
		owner := uint64(100 + i)
		c := benchDial(b, addr, owner)
		table, epoch := benchTable(b, c, fmt.Sprintf("c%03d", i), owner)
		owners[i] = &srvBenchOwner{c: c, commit: sgio.Commit{Owner: owner, Fences: []base.Fence{{Table: table, Epoch: epoch}},
			Segments: []base.Segment{{Table: table, RowBytes: 64, Page: 0, Data: 1, Rows: testkit.Row64(uint64(i))}}}}
	}
	stats := func() (bytes uint64) {
		if !weft {
			return 0
		}
		var st sgio.StatsReply
		if err := owners[0].c.CallInto(context.Background(), &sgio.Stats{}, &st); err != nil {
			return 0 // the echo server has no stats
		}
		for _, s := range st.Stats {
			if s.Name == "received_bytes" || s.Name == "sent_bytes" {
				bytes += s.Value
			}
		}
		return bytes
	}
	before := stats()
	work := make(chan struct{}, committers)
	var wg sync.WaitGroup
	var failed error
	var mu sync.Mutex
	fail := func(err error) {
		mu.Lock()
		failed = err
		mu.Unlock()
	}
	for i := range committers {
		o := owners[i%conns]
		wg.Go(func() {
			done := make(chan error, 1)
			cb := func(_ sgio.Frame, err error) { done <- err }
			for range work {
				// Both the commit message and its rows are immutable once sent; a fresh
				// header per commit keeps the pipelined ones apart.
				o.mu.Lock()
				o.commit.Seq++
				m := o.commit
				err := o.c.Send(context.Background(), &m, cb)
				o.mu.Unlock()
				if err == nil {
					err = <-done
				}
				if err != nil {
					fail(err)
				}
			}
		})
	}
	b.ReportAllocs()
	start := time.Now()
	for b.Loop() {
		work <- struct{}{}
	}
	close(work)
	wg.Wait()
	elapsed := time.Since(start)
	if failed != nil {
		b.Fatal(failed)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "rows/s")
	if after := stats(); after > before {
		// Minus the Stats request and reply of the first reading.
		b.ReportMetric(float64(after-before-uint64(sgio.HeaderSize))/float64(b.N), "wire-B/commit")
	} else {
		b.ReportMetric(float64(2*sgio.HeaderSize+owners[0].commit.BodySize()+(&sgio.CommitAck{}).BodySize()), "wire-B/commit")
	}
}
