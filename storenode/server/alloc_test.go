//go:build !race

package server

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/testkit"
	"github.com/weftdb/weft/sgio"
)

// The allocation guards of the server's hot paths, measured from the client side of a
// loopback connection to a server in the same process: testing.AllocsPerRun counts the
// process's allocations, so each figure covers both sides (the sgio client encoding the
// request and dispatching its reply, the server decoding, handling and writing it back,
// gnet's event loop and, for a commit, the engine and its WAL goroutine).

// TestServerAllocs guards the two paths of a transaction node's remote miss and commit through
// the storage node, each one request at a time (the request's reply is awaited before the next
// is sent), counted in this process, both sides of a loopback connection:
//
//   - read: a ReadPages of one row of a page the server's cache holds (a transaction node's
//     miss Get, answered inline on the event loop: decoded into the session's reused
//     message, the rows gathered into a pooled buffer given back once written). Zero.
//   - commit: a Commit of one 64-byte row (validated and copied into a pooled body on the
//     event loop, submitted by the session's commit goroutine started from a method value
//     made once, acknowledged through a pooled callback from the WAL's goroutine, which hands
//     the reply to the event loop). At most 2: both gnet's, per reply written from a goroutine
//     other than the event loop (Engine.Execute wraps the runnable in a closure,
//     eventloop_unix.go, and its lock-free queue allocates a node per task, queue.Enqueue;
//     every gnet API that reaches the loop from another goroutine, AsyncWritev and Wake
//     included, does the same). Replies that pile up while a write is in progress leave in
//     one such write, so under pipelining the figure per commit is lower.
//
// The client's side of both (sgio.Client.Send with a callback made once) allocates nothing.
func TestServerAllocs(t *testing.T) {
	r := newAllocRig(t)
	for range 200 {
		r.commitOne()
		r.readOne()
	}
	reads := testing.AllocsPerRun(500, r.readOne)
	commits := testing.AllocsPerRun(500, r.commitOne)
	t.Logf("allocs per op through the server (both sides): read %v, commit %v", reads, commits)
	require.Zero(t, reads, "a cached read through the server allocates")
	require.LessOrEqual(t, commits, 2.0, "a commit through the server allocates more than gnet's Execute")
}

// allocRig is a server, one client connection as its table's owner, and one table whose
// allocPages pages hold a row each.
type allocRig struct {
	c      *sgio.Client
	table  uint32
	commit sgio.Commit
	read   sgio.ReadPages
	page   uint64
	done   chan error
	cb     func(sgio.Frame, error)
}

const allocPages = 64

func newAllocRig(t testing.TB) *allocRig {
	r := allocRigOn(t, startServer(t), allocPages)
	for range allocPages {
		r.commitOne()
	}
	return r
}

// allocRigOn dials env as testOwner and creates the rig's table "allocs" of pages id pages,
// nothing written yet; its commit and read are of one row (page 0 until set).
func allocRigOn(t testing.TB, env *srvEnv, pages uint32) *allocRig {
	t.Helper()
	c := env.dial(testOwner)
	ti, g := srvAllocTable(t, srvCtx(t), c, "allocs", pages)
	r := &allocRig{c: c, table: ti.Table, done: make(chan error, 1)}
	r.cb = func(_ sgio.Frame, err error) { r.done <- err }
	r.commit = sgio.Commit{Owner: testOwner, Fences: []base.Fence{{Table: ti.Table, Epoch: g.Epoch}},
		Segments: []base.Segment{{Table: ti.Table, RowBytes: 64, Data: 1, Rows: testkit.Row64(1)}}}
	r.read = sgio.ReadPages{Wants: []base.PageWant{{Table: ti.Table, Want: 1}}}
	return r
}

// commitOne commits one row to the next page and waits for the acknowledgement.
func (r *allocRig) commitOne() {
	r.commit.Seq++
	r.commit.Segments[0].Page = r.page % allocPages
	r.page++
	r.call(&r.commit)
}

// readOne reads one row of the next page and waits for the reply.
func (r *allocRig) readOne() {
	r.read.Wants[0].Page = r.page % allocPages
	r.page++
	r.call(&r.read)
}

func (r *allocRig) call(m sgio.Message) {
	if err := r.c.Send(context.Background(), m, r.cb); err != nil {
		panic(err)
	}
	if err := <-r.done; err != nil {
		panic(err)
	}
}

// BenchmarkServerAllocs: one commit or one read (answered from the server's cache, or not) at a time through a server in this
// process, for the allocation profile of both sides (go test -run '^$' -bench
// BenchmarkServerAllocs -memprofile mem.out -memprofilerate 1).
func BenchmarkServerAllocs(b *testing.B) {
	for _, op := range []string{"commit", "read", "readmiss"} {
		b.Run("op="+op, func(b *testing.B) {
			var f func()
			switch op {
			case "commit":
				f = newAllocRig(b).commitOne
			case "read":
				f = newAllocRig(b).readOne
			default: // a read the server's cache misses
				_, f = newMissRig(b)
			}
			for range 200 {
				f()
			}
			b.ReportAllocs()
			for b.Loop() {
				f()
			}
		})
	}
}

// TestServerSlowReadAllocs bounds a read the cache cannot answer (the engine's cache holds
// 128 KiB of 256 pages: nearly every read is a disk read, ReadRowsAs on the turn's read
// goroutine), counted as TestServerAllocs counts. At most 2, both gnet's, per reply written
// from a goroutine (see TestServerAllocs); the server's side is pooled (readTurn: the turn's
// read list, its owned copies of the ReadPages, the reply and its segments, the goroutine's
// method value; the rows in pooled buffers) and the engine's disk read allocates nothing. The
// engine's background checkpoints (the tiny cache makes them frequent) allocate too, far
// below one per read; the few reads the cache still answers inline cost 0.
func TestServerSlowReadAllocs(t *testing.T) {
	env, read := newMissRig(t)
	for range 300 {
		read()
	}
	before := env.srv.eng.Stats().DiskReads
	n := testing.AllocsPerRun(500, read)
	reads := env.srv.eng.Stats().DiskReads - before
	t.Logf("allocs per read that misses the server's cache (both sides): %v; %d disk reads in 501 reads", n, reads)
	require.Greater(t, reads, uint64(400), "the reads did not miss the cache")
	require.LessOrEqual(t, n, 2.0)
}

// newMissRig starts a server whose engine caches 128 KiB of a 256-page table and returns a
// read of one row that nearly always misses its cache.
func newMissRig(t testing.TB) (*srvEnv, func()) {
	env := startServer(t, func(c *Config) { c.Options.CacheBytes = 128 << 10 })
	const pages = 256
	r := allocRigOn(t, env, pages)
	for p := range uint64(pages) {
		r.commit.Seq++
		r.commit.Segments[0].Page = p
		r.call(&r.commit)
	}
	p := uint64(0)
	read := func() {
		r.read.Wants[0].Page = p % pages
		p += 97 // a page the cache evicted since
		r.call(&r.read)
	}
	return env, read
}
