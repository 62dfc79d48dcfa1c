package sgio

import (
	"bytes"
	"encoding/hex"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
)

// goldenCommit is the Commit frame shown in docs/wire.md: two tables, two segments, rows of
// recognisable ASCII.
func goldenCommit() (uint64, *Commit) {
	return 42, &Commit{
		Owner: 7, Seq: 3,
		Fences: []base.Fence{{Table: 1, Epoch: 5}, {Table: 2, Epoch: 9}},
		Segments: []base.Segment{
			{Table: 1, RowBytes: 8, Page: 0, Data: 0b101, Clear: 0b010, Rows: []byte("slot-000slot-002")},
			{Table: 2, RowBytes: 16, Page: 3, Data: 1 << 63, Rows: []byte("page3-slot63-row")},
		},
	}
}

// goldenFromDoc parses the hex dump that follows the golden-commit-frame marker in
// docs/wire.md: lines "offset: hex bytes  # comment", offsets contiguous.
func goldenFromDoc(t *testing.T) []byte {
	doc, err := os.ReadFile("../docs/wire.md")
	require.NoError(t, err)
	_, block, ok := strings.Cut(string(doc), "<!-- golden-commit-frame -->")
	require.True(t, ok, "marker in docs/wire.md")
	_, block, ok = strings.Cut(block, "```text\n")
	require.True(t, ok)
	block, _, ok = strings.Cut(block, "```")
	require.True(t, ok)
	var frame []byte
	for line := range strings.Lines(block) {
		line, _, _ = strings.Cut(line, "#")
		off, hexBytes, ok := strings.Cut(line, ":")
		require.True(t, ok, "line %q", line)
		o, err := strconv.ParseUint(strings.TrimSpace(off), 16, 32)
		require.NoError(t, err)
		require.Equal(t, len(frame), int(o), "offsets are contiguous")
		b, err := hex.DecodeString(strings.ReplaceAll(strings.TrimSpace(hexBytes), " ", ""))
		require.NoError(t, err, "line %q", line)
		frame = append(frame, b...)
	}
	return frame
}

func TestGoldenCommitFrame(t *testing.T) {
	frame := goldenFromDoc(t)
	f, n, err := Decode(frame, MaxBodyLimit)
	require.NoError(t, err)
	require.Equal(t, len(frame), n)
	require.Equal(t, TypeCommit, f.Type)
	id, want := goldenCommit()
	require.Equal(t, id, f.ID)

	var c Commit
	require.NoError(t, c.Parse(f.Body))
	require.Equal(t, want, &c)
	require.Equal(t, "slot-000", string(c.Segments[0].Rows[:8]))
	require.Equal(t, "page3-slot63-row", string(c.Segments[1].Rows))

	// Re-encoding gives the same bytes, contiguous or gathered.
	require.Equal(t, frame, AppendFrame(nil, id, want))
	var w Writer
	w.Append(id, want)
	require.Equal(t, frame, bytes.Join(w.Buffers(), nil))
}
