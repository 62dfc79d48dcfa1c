//go:build !race

package sgio

import (
	"io"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
)

// The hot paths allocate nothing once warm.
func TestHotPathsDoNotAllocate(t *testing.T) {
	c := commitBatch(128, 1)
	ack := &CommitAck{LSN: 1}
	var w Writer
	encode := func() {
		for i := range 4 {
			c.Seq = uint64(i)
			ack.Seq = uint64(i)
			w.Append(uint64(i), c)
			w.Append(uint64(i), ack)
		}
		w.Reset()
	}
	encode()
	require.Zero(t, testing.AllocsPerRun(100, encode), "Writer.Append + Reset")

	frame := AppendFrame(nil, 1, c)
	decode := func() {
		f, _, err := Decode(frame, MaxBodyLimit)
		if err != nil {
			panic(err)
		}
		v, err := ViewCommit(f.Body)
		if err != nil {
			panic(err)
		}
		var s base.Segment
		it := v.Segments()
		for it.Next(&s) {
		}
	}
	require.Zero(t, testing.AllocsPerRun(100, decode), "Decode + ViewCommit + SegmentIter")

	var parsed Commit
	require.NoError(t, parsed.Parse(frame[HeaderSize:]))
	require.Zero(t, testing.AllocsPerRun(100, func() { _ = parsed.Parse(frame[HeaderSize:]) }), "Commit.Parse into a warm Commit")

	rp := &ReadPages{Wants: make([]base.PageWant, 100)}
	rpBody := rp.AppendBody(nil)
	require.Zero(t, testing.AllocsPerRun(100, func() { _ = rp.Parse(rpBody) }), "ReadPages.Parse into a warm ReadPages")
}

func TestWriteToTCPDoesNotAllocate(t *testing.T) {
	client, server := tcpPair(t)
	go func() { _, _ = io.Copy(io.Discard, server) }()
	c := commitBatch(16, 64)
	var w Writer
	write := func() {
		w.Append(1, c)
		if _, err := w.WriteTo(client); err != nil {
			panic(err)
		}
	}
	write()
	require.Zero(t, testing.AllocsPerRun(100, write), "Writer.Append + WriteTo(*net.TCPConn)")
}
