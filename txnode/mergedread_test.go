package txnode

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/storenode/server"
)

// A merged ReadPages must fit the request body the storage node accepts (its MaxBody, from
// HelloReply): two reads of 32 pages each fit alone (776 bytes) but not together (1544), so
// the second may not join the first's batch. Joined, the frame is refused as too large and
// the connection closed, every member retries, and may merge again. Deterministic: the
// connection's single in-flight slot is held by a Ping whose reply the proxy keeps back, so
// the first read's batch stays open while the second arrives.
func TestMergedReadFitsServerMaxBody(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := server.New(server.Config{Listen: "127.0.0.1:0", MaxBody: 1024, MaxInflight: 1,
		Options: storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone}})
	require.NoError(t, err)
	require.NoError(t, srv.Start())
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	p := startGateProxy(t, srv.Addr().String())
	db := openDB(t, ctx, Options{StoreAddr: p.ln.Addr().String(), CacheBytes: 64 << 10, OwnerID: 45})
	defer db.Close(ctx)
	tab := newTable(t, ctx, db, "t", 64)
	st := db.store.(*remoteStore)
	require.Equal(t, 1, st.conn.MaxInflight())

	p.setPaused(true)
	pinged := make(chan error, 1)
	go func() { pinged <- st.Ping(ctx) }()
	select { // the Ping holds the only slot; its Pong waits at the gate
	case <-p.sent:
	case <-ctx.Done():
		t.Fatal("the Ping was not sent")
	}
	read := func(first uint64, out chan<- error) {
		reqs := make([]base.PageWant, 32)
		for i := range reqs {
			reqs[i] = base.PageWant{Table: tab.t.id, Page: first + uint64(i), Want: 1}
		}
		out <- st.Read(ctx, reqs, func(int, uint64, uint64, []byte) {})
	}
	members := func(b *readBatch) (int, bool) {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.members), b.sealed
	}
	done := make(chan error, 2)
	go read(0, done)
	var first *readBatch
	waitUntil(t, "the first read opens a batch", func() bool {
		st.rmu.Lock()
		defer st.rmu.Unlock()
		first = st.openRead
		if first == nil {
			return false
		}
		n, sealed := members(first)
		return n == 1 && !sealed
	})
	go read(32, done)
	waitUntil(t, "the second read joins the batch or opens its own", func() bool {
		st.rmu.Lock()
		defer st.rmu.Unlock()
		if n, _ := members(first); n == 2 {
			return true // joined: the defect
		}
		if b := st.openRead; b != first && b != nil {
			n, _ := members(b)
			return n == 1
		}
		return false
	})
	st.mu.Lock()
	gen := st.gen
	st.mu.Unlock()
	p.setPaused(false)
	require.NoError(t, <-pinged)
	require.NoError(t, <-done)
	require.NoError(t, <-done)
	st.mu.Lock()
	genAfter := st.gen
	st.mu.Unlock()
	require.Equal(t, gen, genAfter, "the connection broke: a merged frame exceeded the server's MaxBody")
	require.NoError(t, st.conn.Err())
}
