package server

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/internal/testkit"
	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// A transaction node restarted with the same owner id (a new incarnation, after a lease of
// silence) is not the writer of the old incarnation's rows not durable yet: over TCP its
// ReadPages, answered on the event loop's fast path (Engine.ReadCached) when the page is
// cached, must not be served them; it waits for their fsync like any other reader
// (holderReads), while the incarnation that wrote them reads them at once. Fails on bc2d8a2
// with ReadCached's holderReads reverted to heldBy (the owner id alone): the new incarnation
// got the row while its fsync was blocked.
func TestServerNewIncarnationFastReadWaitsForSync(t *testing.T) {
	var fs *vfs.FaultFS
	var clock *fakeClock
	env := startServer(t, withClock(&clock), withFaultFS(&fs))
	a := env.dial(9, withIncarnation(0xa))
	ti, g := srvTable(t, a, "t", 9)
	block := testkit.NewBlockSyncs(fs)
	released := false
	t.Cleanup(func() {
		if !released {
			block.Release(true)
		}
	})
	acked := make(chan error, 1)
	go func() {
		acked <- a.CallInto(srvCtx(t), srvCommit(ti.Table, 9, g.Epoch, 1, []uint64{3}, 33), &sgio.CommitAck{})
	}()
	block.WaitBlocked(t, idWait)
	row, ok := srvReadRow(t, a, ti.Table, 3) // the writing incarnation sees its own write
	require.True(t, ok)
	require.Equal(t, testkit.Row64(33), row)

	// A falls silent for a lease; B, a new incarnation of owner 9, claims the id (A's
	// connection is closed).
	clock.Advance(storenode.DefaultLeaseDuration)
	b := env.dial(9, withIncarnation(0xb))
	select {
	case <-a.Done():
	case <-time.After(srvTestTimeout):
		t.Fatal("the silent holder's connection stays open")
	}
	got := readRowAsync(t, b, ti.Table, 3)
	waitDurableWaiter(t, env.srv.Engine(), func() bool { return len(got) > 0 })
	require.Empty(t, got, "the new incarnation was served a row not durable yet")
	released = true
	block.Release(false)
	<-acked // A's connection closed: its ack may be lost; the row is durable either way
	r := <-got
	require.NoError(t, r.err)
	require.True(t, r.present)
}
