package sgio

import (
	"bytes"
	"io"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
)

func flatten(v [][]byte) []byte { return bytes.Join(v, nil) }

// The gathering Writer produces exactly the bytes of AppendFrame, for every message type.
func TestWriterMatchesAppendFrame(t *testing.T) {
	var w Writer
	var want []byte
	for round, copyBelow := range []int{0, -1, 1 << 20, 0} { // reuse after Reset
		w.CopyBelow = copyBelow
		want = want[:0]
		for i, m := range sampleMessages() {
			w.Append(uint64(i), m)
			want = AppendFrame(want, uint64(i), m)
		}
		require.Equal(t, len(sampleMessages()), w.Frames())
		require.Equal(t, int64(len(want)), w.Len())
		require.Equal(t, want, flatten(w.Buffers()), "round %d", round)
		w.Reset()
		require.Zero(t, w.Len())
		require.Empty(t, w.Buffers())
	}
}

// Rows go out by reference: each segment's Rows, or each run, is its own slice of the
// gather list, aliasing the caller's memory.
func TestWriterGathersRowsByReference(t *testing.T) {
	page := rows(64, 64, 0) // one page frame of 64-byte rows
	// Slots 0..3 and 10..11 as two runs of the page frame.
	c := &Commit{Owner: 1, Seq: 2, Fences: []base.Fence{{Table: 5, Epoch: 1}},
		Segments: []base.Segment{{Table: 5, RowBytes: 64, Page: 0, Data: 0b1100_0000_1111}},
		Runs:     [][][]byte{{page[0 : 4*64], page[10*64 : 12*64]}},
	}
	require.NoError(t, c.Validate())
	w := Writer{CopyBelow: -1}
	w.Append(9, c)
	vec := w.Buffers()
	require.Len(t, vec, 3, "header+fixed+segment header, run, run")
	require.True(t, aliases(page, vec[1]))
	require.True(t, aliases(page, vec[2]))

	// By default a short run is copied into the scratch slice, a long one referenced.
	var dw Writer
	dw.Append(9, c)
	require.Len(t, dw.Buffers(), 3, "fixed fields + copied 128-byte run, referenced 256-byte run")
	require.True(t, aliases(page, dw.Buffers()[1]))
	require.False(t, aliases(page, dw.Buffers()[0]))
	require.Equal(t, flatten(vec), flatten(dw.Buffers()))

	// The same commit with Rows copied into one slice encodes to the same bytes.
	flat := &Commit{Owner: 1, Seq: 2, Fences: c.Fences, Segments: []base.Segment{c.Segments[0]}}
	flat.Segments[0].Rows = append(bytes.Clone(page[0:4*64]), page[10*64:12*64]...)
	require.Equal(t, AppendFrame(nil, 9, flat), flatten(vec))

	f, _, err := Decode(flatten(vec), MaxBodyLimit)
	require.NoError(t, err)
	var got Commit
	require.NoError(t, got.Parse(f.Body))
	require.Equal(t, flat, &got)
}

// Fixed fields between row slices coalesce into one scratch slice per run of fixed bytes.
func TestWriterCoalescesScratch(t *testing.T) {
	var w Writer
	for i := range 100 {
		w.Append(uint64(i), &Ping{})
		w.Append(uint64(i), &CommitAck{LSN: uint64(i)})
	}
	require.Len(t, w.Buffers(), 1, "all fixed bytes land in one chunk, one slice")
	// A large fixed part spills into a new chunk: still correct.
	big := &PageDirReply{Entries: make([]PageEntry, writerChunkBytes/16+1)}
	w.Append(1, big)
	want := []byte{}
	for i := range 100 {
		want = AppendFrame(want, uint64(i), &Ping{})
		want = AppendFrame(want, uint64(i), &CommitAck{LSN: uint64(i)})
	}
	want = AppendFrame(want, 1, big)
	require.Equal(t, want, flatten(w.Buffers()))
}

func TestWriterPanicsOnInconsistentRows(t *testing.T) {
	var w Writer
	c := &Commit{Segments: []base.Segment{{Table: 1, RowBytes: 8, Data: 3, Rows: rows(1, 8, 0)}}}
	require.Panics(t, func() { w.Append(1, c) })
}

// writeCounter counts Write calls: a writer without writev gets one flattened Write.
type writeCounter struct {
	bytes.Buffer
	writes int
}

func (c *writeCounter) Write(p []byte) (int, error) { c.writes++; return c.Buffer.Write(p) }

func TestWriterWriteTo(t *testing.T) {
	var w Writer
	var want []byte
	for i, m := range sampleMessages() {
		w.Append(uint64(i), m)
		want = AppendFrame(want, uint64(i), m)
	}
	var dst writeCounter
	n, err := w.WriteTo(&dst)
	require.NoError(t, err)
	require.Equal(t, int64(len(want)), n)
	require.Equal(t, 1, dst.writes)
	require.Equal(t, want, dst.Bytes())
	require.Zero(t, w.Len(), "WriteTo resets")
	n, err = w.WriteTo(&dst)
	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, 1, dst.writes, "nothing to write, no Write")
}

func TestWriterWriteToTCP(t *testing.T) {
	client, server := tcpPair(t)
	var w Writer
	var want []byte
	for i, m := range sampleMessages() {
		w.Append(uint64(i), m)
		want = AppendFrame(want, uint64(i), m)
	}
	done := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(server, int64(len(want))))
		done <- b
	}()
	n, err := w.WriteTo(client)
	require.NoError(t, err)
	require.Equal(t, int64(len(want)), n)
	require.Equal(t, want, <-done)
}

// tcpPair returns both ends of a loopback TCP connection, closed at the end of the test.
func tcpPair(t testing.TB) (*net.TCPConn, *net.TCPConn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	server := <-accepted
	require.NotNil(t, server)
	t.Cleanup(func() { client.Close(); server.Close() })
	return client.(*net.TCPConn), server.(*net.TCPConn)
}
