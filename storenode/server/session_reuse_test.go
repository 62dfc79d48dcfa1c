package server

import (
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/testkit"
	"github.com/weftdb/weft/sgio"
)

// TestServerReusedSlicesBounded: the slices a session reuses per request (its commit
// goroutine's Batch, the loop's ReadPages) do not keep a large request's size for the
// session's life: after a commit and a read of 300 pages each, at most commitSegmentsKeep
// and readWantsKeep entries stay.
func TestServerReusedSlicesBounded(t *testing.T) {
	env := startServer(t)
	c := env.dial(testOwner)
	ctx := srvCtx(t)
	const pages = 300
	ti, g := srvAllocTable(t, ctx, c, "big", pages)
	commit := &sgio.Commit{Owner: testOwner, Seq: 1, Fences: []base.Fence{{Table: ti.Table, Epoch: g.Epoch}}}
	read := &sgio.ReadPages{}
	for p := range uint64(pages) {
		commit.Segments = append(commit.Segments, base.Segment{Table: ti.Table, RowBytes: 64, Page: p, Data: 1, Rows: testkit.Row64(p)})
		read.Wants = append(read.Wants, base.PageWant{Table: ti.Table, Page: p, Want: 1})
	}
	_, err := c.Call(ctx, commit)
	require.NoError(t, err)
	var got sgio.Segments
	require.NoError(t, c.CallInto(ctx, read, &got))
	require.Len(t, got.Segments, pages)

	sess := env.sessionOf(t, testOwner)
	deadline := time.Now().Add(srvTestTimeout)
	for {
		sess.mu.Lock()
		committing := sess.committing
		segs, fences := cap(sess.commitBatch.Segments), cap(sess.commitBatch.Fences)
		sess.mu.Unlock()
		if !committing {
			require.LessOrEqual(t, segs, commitSegmentsKeep, "the commit goroutine's batch keeps a large batch's segments")
			require.LessOrEqual(t, fences, commitSegmentsKeep)
			break
		}
		require.True(t, time.Now().Before(deadline), "the commit goroutine did not end")
		runtime.Gosched()
	}
	// The loop's fields: read once the loop has answered a Ping sent after the read.
	require.NoError(t, c.CallInto(ctx, &sgio.Ping{}, &sgio.Pong{}))
	sess.mu.Lock() // the loop took it after handling the read (inbound's end), before the Pong

	wants, inline := cap(sess.loopRead.Wants), cap(sess.inlineSegs)
	sess.mu.Unlock()
	require.LessOrEqual(t, wants, readWantsKeep, "the loop's ReadPages keeps a large read's wants")
	require.LessOrEqual(t, inline, readWantsKeep)
}

// TestReadTurnReleaseBounded: a pooled turn goes back without what a large turn grew.
func TestReadTurnReleaseBounded(t *testing.T) {
	turn := &readTurn{reads: make([]readRequest, 0, 1000), reply: sgio.Segments{Segments: make([]base.Segment, 1000)}}
	for range 100 {
		turn.msgs = append(turn.msgs, &sgio.ReadPages{Wants: make([]base.PageWant, 1000)})
	}
	turn.used = len(turn.msgs)
	turn.run = turn.runReads // release pools it: as turn() makes them
	msgs := turn.msgs
	turn.release()
	require.Nil(t, turn.s)
	require.Zero(t, turn.used)
	require.LessOrEqual(t, cap(turn.reads), readTurnKeep)
	require.LessOrEqual(t, len(turn.msgs), readTurnKeep)
	require.LessOrEqual(t, cap(turn.reply.Segments), readWantsKeep)
	for _, m := range msgs[:readTurnKeep] {
		require.LessOrEqual(t, cap(m.Wants), readWantsKeep)
	}
}
