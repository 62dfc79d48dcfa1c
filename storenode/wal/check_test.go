package wal

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/internal/vfs"
)

// checkAgreesWithOpen runs Check on a restored copy of s, then Open on another, and requires
// the same verdict: both fail with corruption (Check naming the same message), or Check
// reports the torn tail (or clean end) after which Open's log ends. Check must leave the
// files as they were.
func checkAgreesWithOpen(t *testing.T, s snapshot, opts Options, what string) CheckResult {
	t.Helper()
	fs := s.restore(t)
	var visited []uint64
	res, cerr := Check(vfs.ReadOnly(fs), testDir, opts, func(r Record, at Position) error {
		require.Equal(t, r.LSN, at.LSN)
		b := s[at.File]
		require.Equal(t, r.LSN, binary.LittleEndian.Uint64(b[at.Offset+recordLSNOffset:]), "%s: record at %+v", what, at)
		visited = append(visited, r.LSN)
		return nil
	})
	require.Equal(t, s, takeSnapshot(t, fs), "%s: Check changed the log", what)
	w, got, oerr := openCollect(t, s.restore(t), opts)
	if oerr != nil {
		require.ErrorIs(t, oerr, corrupt.ErrCorruption, what)
		require.ErrorIs(t, cerr, corrupt.ErrCorruption, what)
		require.Equal(t, oerr.Error(), cerr.Error(), what)
		if len(s) > 0 {
			require.NotEmpty(t, res.Bad.File, what)
		}
		return res
	}
	require.NoError(t, cerr, what)
	require.Equal(t, w.LastLSN(), res.LastLSN, what)
	require.NoError(t, w.Close())
	for i, r := range got {
		require.Equal(t, r.LSN, visited[i], what)
	}
	return res
}

func TestCheckAgreesWithRecovery(t *testing.T) {
	const n = 10
	snap := buildLog(t, n, DefaultSegmentBytes)
	name := segmentName(1)
	res := checkAgreesWithOpen(t, snap, Options{}, "clean")
	require.Nil(t, res.Tail)
	require.EqualValues(t, n, res.Records)
	require.EqualValues(t, 1, res.Segments)
	require.EqualValues(t, len(snap[name]), res.Bytes)

	data := snap[name]
	start, end := lastRecordSpan(data, n)
	for off := start; off < end; off += 5 {
		b := bytes.Clone(data)
		b[off] ^= 0x10
		what := fmt.Sprintf("flip at %d", off)
		res := checkAgreesWithOpen(t, snapshot{name: b}, Options{}, what)
		require.NotNil(t, res.Tail, what)
		require.Equal(t, TornTail{File: name, Offset: int64(start), LSN: n, Bytes: int64(end - start), Cause: res.Tail.Cause}, *res.Tail, what)
		// The same damage at or below the synced LSN of the last checkpoint is corruption.
		res = checkAgreesWithOpen(t, snapshot{name: b}, Options{After: 2, DurableThrough: n}, what+", durable")
		require.Equal(t, Position{File: name, Offset: int64(start), LSN: n}, res.Bad, what)
	}
	// Record 5 damaged: record 6 was written after 5 was synced, so it proves 5 durable.
	off := segmentHeaderSize
	for k := uint64(1); k < 5; k++ {
		off += recordSize(len(payloadOf(k)))
	}
	b := bytes.Clone(data)
	b[off+recordHeaderSize] ^= 1
	res = checkAgreesWithOpen(t, snapshot{name: b}, Options{}, "middle")
	require.Equal(t, Position{File: name, Offset: int64(off), LSN: 5}, res.Bad)
	require.EqualValues(t, 4, res.Records)

	// Cut short below the checkpoint, segments missing, a later segment.
	checkAgreesWithOpen(t, snapshot{name: data[:start]}, Options{After: n}, "short of the checkpoint")
	checkAgreesWithOpen(t, snapshot{}, Options{After: 3}, "no segment")
	late := buildLog(t, 12, 512)
	lateSegs := sortedNames(late)
	delete(late, lateSegs[0])
	res = checkAgreesWithOpen(t, late, Options{}, "first segment starts late")
	require.Equal(t, Position{File: lateSegs[1], LSN: 1}, res.Bad)
	multi := buildLog(t, 60, 512)
	segs := sortedNames(multi)
	s := snapshot{}
	for k, v := range multi {
		s[k] = v
	}
	delete(s, segs[2])
	res = checkAgreesWithOpen(t, s, Options{}, "missing segment")
	require.Equal(t, segs[3], res.Bad.File)
	s[segs[2]] = multi[segs[2]]
	res = checkAgreesWithOpen(t, s, Options{}, "multi clean")
	require.EqualValues(t, 60, res.Records)
	require.Equal(t, len(segs), res.Segments)
	b = bytes.Clone(multi[segs[1]])
	b[len(b)-3] ^= 1
	s[segs[1]] = b
	res = checkAgreesWithOpen(t, s, Options{}, "bad record before a later segment")
	require.Equal(t, segs[1], res.Bad.File)
}

// TestCheckOldSegments: segments wholly at or below After are read too, and their damage is
// reported apart, without failing the check (recovery never reads them).
func TestCheckOldSegments(t *testing.T) {
	snap := buildLog(t, 60, 512)
	segs := sortedNames(snap)
	require.Greater(t, len(segs), 3)
	second, _ := parseSegmentName(segs[2])
	after := second - 1 // segments 0 and 1 lie wholly at or below it
	res := checkAgreesWithOpen(t, snap, Options{After: after}, "old segments")
	require.Equal(t, 2, res.OldSegments)
	require.Equal(t, after, res.OldRecords)
	require.Empty(t, res.OldBad)
	require.Equal(t, 60-after, res.Records)

	b := bytes.Clone(snap[segs[1]])
	b[segmentHeaderSize+recordHeaderSize] ^= 1
	s := snapshot{}
	for k, v := range snap {
		s[k] = v
	}
	s[segs[1]] = b
	res = checkAgreesWithOpen(t, s, Options{After: after}, "damaged old segment")
	require.Len(t, res.OldBad, 1)
	first1, _ := parseSegmentName(segs[1])
	require.Equal(t, Position{File: segs[1], Offset: segmentHeaderSize, LSN: first1}, res.OldBad[0].Position)
	require.ErrorIs(t, res.OldBad[0].Cause, corrupt.ErrCorruption)
}
