package wal

import (
	"bytes"
	"fmt"
	"path"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/internal/vfs"
)

// snapshot is the content of the segment files of a log.
type snapshot map[string][]byte

func takeSnapshot(t testing.TB, fs *vfs.FaultFS) snapshot {
	t.Helper()
	s := snapshot{}
	for _, name := range segments(t, fs) {
		b, err := fs.ReadFile(path.Join(testDir, name))
		require.NoError(t, err)
		s[name] = b
	}
	return s
}

// restore returns a new FaultFS holding the files of s, durably.
func (s snapshot) restore(t testing.TB) *vfs.FaultFS {
	t.Helper()
	fs := vfs.NewFaultFS()
	require.NoError(t, fs.MkdirAll(testDir))
	for name, b := range s {
		require.NoError(t, fs.WriteFile(path.Join(testDir, name), b))
	}
	return fs
}

// buildLog writes records 1..n with Append (each synced before the next is written, so each
// record's synced-through is its LSN-1) and returns the segment files.
func buildLog(t testing.TB, n uint64, segmentBytes int64) snapshot {
	t.Helper()
	fs := vfs.NewFaultFS()
	w, _ := mustOpen(t, fs, Options{SegmentBytes: segmentBytes})
	appendN(t, w, 1, n)
	require.NoError(t, w.Close())
	return takeSnapshot(t, fs)
}

// requireTornTail opens the log on fs and checks that it holds records 1..kept, then that
// appends continue at kept+1 and survive a reopen.
func requireTornTail(t testing.TB, fs *vfs.FaultFS, kept uint64, msg string) {
	t.Helper()
	w, got, err := openCollect(t, fs, Options{})
	require.NoError(t, err, msg)
	requireRecords(t, got, 1, kept)
	require.Equal(t, kept, w.LastLSN(), msg)
	appendN(t, w, kept+1, kept+2)
	require.NoError(t, w.Close())
	w, got, err = openCollect(t, fs, Options{})
	require.NoError(t, err, msg)
	requireRecords(t, got, 1, kept+2)
	require.NoError(t, w.Close())
}

// lastRecordSpan returns the offsets of the last record of a one-segment log of n records.
func lastRecordSpan(data []byte, n uint64) (start, end int) {
	end = len(data)
	return end - recordSize(len(payloadOf(n))), end
}

func TestTornTailEveryOffset(t *testing.T) {
	const n = 6
	snap := buildLog(t, n, DefaultSegmentBytes)
	require.Len(t, snap, 1)
	name := segmentName(1)
	data := snap[name]
	start, end := lastRecordSpan(data, n)
	for cut := start; cut < end; cut++ {
		fs := snapshot{name: data[:cut]}.restore(t)
		requireTornTail(t, fs, n-1, fmt.Sprintf("cut at %d", cut))
	}
	// Preallocated (or never-written) zeros after the last record are the end of the log.
	fs := snapshot{name: append(bytes.Clone(data), make([]byte, 4096)...)}.restore(t)
	requireTornTail(t, fs, n, "zeros")
}

func TestTornTailBitFlips(t *testing.T) {
	const n = 6
	snap := buildLog(t, n, DefaultSegmentBytes)
	name := segmentName(1)
	data := snap[name]
	start, end := lastRecordSpan(data, n)
	step := 1
	if testing.Short() {
		step = 13
	}
	for bit := start * 8; bit < end*8; bit += step {
		b := bytes.Clone(data)
		b[bit/8] ^= 1 << (bit % 8)
		requireTornTail(t, snapshot{name: b}.restore(t), n-1, fmt.Sprintf("bit %d", bit))
	}
}

// TestTornNewSegment cuts the newest segment inside its header: the segment is made anew.
func TestTornNewSegment(t *testing.T) {
	snap := buildLog(t, 40, 512)
	segs := sortedNames(snap)
	require.Greater(t, len(segs), 3)
	lastName := segs[len(segs)-1]
	first, _ := parseSegmentName(lastName)
	for cut := range segmentHeaderSize + recordHeaderSize {
		s := snapshot{}
		for k, v := range snap {
			s[k] = v
		}
		s[lastName] = snap[lastName][:cut]
		requireTornTail(t, s.restore(t), first-1, fmt.Sprintf("cut at %d", cut))
	}
}

// TestBadRecordBeforeLaterSegment: a bad record in a segment that has a later segment, even
// one that holds no valid record (its header only, or nothing), is corruption, never a torn
// tail: a segment is created only after the one before it was synced through its end (roll),
// so the bad record had been durable and acknowledged. Found in review: recovery took it for
// a torn tail, removed the later segment and dropped the acknowledged records.
func TestBadRecordBeforeLaterSegment(t *testing.T) {
	const n = 6
	snap := buildLog(t, n, DefaultSegmentBytes)
	name := segmentName(1)
	start, _ := lastRecordSpan(snap[name], n)
	hdr := make([]byte, segmentHeaderSize)
	encodeSegmentHeader(hdr, n+1)
	for _, later := range [][]byte{hdr, hdr[:5], nil} {
		requireCorrupt(t, snapshot{name: snap[name][:start+5], segmentName(n + 1): later}, Options{},
			name, fmt.Sprintf("offset %d", start), segmentName(n+1))
		b := bytes.Clone(snap[name])
		b[start+recordHeaderSize] ^= 1
		requireCorrupt(t, snapshot{name: b, segmentName(n + 1): later}, Options{}, name, fmt.Sprintf("offset %d", start))
	}
}

func sortedNames(s snapshot) []string {
	var names []string
	for k := range s {
		names = append(names, k)
	}
	for i := range names {
		for j := i + 1; j < len(names); j++ {
			if names[j] < names[i] {
				names[i], names[j] = names[j], names[i]
			}
		}
	}
	return names
}

// requireCorrupt opens the log and checks it fails with a corruption error containing the
// fragments, and that the failed Open changed no file.
func requireCorrupt(t testing.TB, s snapshot, opts Options, fragments ...string) {
	t.Helper()
	fs := s.restore(t)
	_, _, err := openCollect(t, fs, opts)
	require.ErrorIs(t, err, corrupt.ErrCorruption)
	for _, f := range fragments {
		require.ErrorContains(t, err, f)
	}
	require.Equal(t, s, takeSnapshot(t, fs), "a failed Open changes nothing")
}

func TestCorruptMiddleRecord(t *testing.T) {
	const n = 10
	snap := buildLog(t, n, DefaultSegmentBytes)
	name := segmentName(1)
	// Record 5's offset: the header plus records 1..4.
	off := segmentHeaderSize
	for k := uint64(1); k < 5; k++ {
		off += recordSize(len(payloadOf(k)))
	}
	for _, delta := range []int{0, 4, 8, 24, recordHeaderSize} {
		b := bytes.Clone(snap[name])
		b[off+delta] ^= 0x40
		requireCorrupt(t, snapshot{name: b}, Options{}, name, fmt.Sprintf("offset %d", off), "LSN 5")
	}
	// Zeroed sectors (a lost write) in the middle are corruption too.
	b := bytes.Clone(snap[name])
	clear(b[off : off+16])
	requireCorrupt(t, snapshot{name: b}, Options{}, name, fmt.Sprintf("offset %d", off))
}

func TestCorruptEarlierSegment(t *testing.T) {
	snap := buildLog(t, 60, 512)
	segs := sortedNames(snap)
	require.Greater(t, len(segs), 3)

	// A bad record in a segment that is not the newest.
	s := snapshot{}
	for k, v := range snap {
		s[k] = v
	}
	b := bytes.Clone(snap[segs[1]])
	b[segmentHeaderSize+recordHeaderSize] ^= 1
	s[segs[1]] = b
	requireCorrupt(t, s, Options{}, segs[1], fmt.Sprintf("offset %d", segmentHeaderSize))

	// An earlier segment cut short: its last records are gone.
	s[segs[1]] = snap[segs[1]][:len(snap[segs[1]])-8]
	requireCorrupt(t, s, Options{}, segs[1])

	// A bad segment header in the middle.
	b = bytes.Clone(snap[segs[2]])
	b[0] ^= 1
	s[segs[1]] = snap[segs[1]]
	s[segs[2]] = b
	requireCorrupt(t, s, Options{}, segs[2], "offset 0")

	// A missing segment.
	s[segs[2]] = snap[segs[2]]
	delete(s, segs[2])
	requireCorrupt(t, s, Options{}, segs[3])
}

func TestCorruptCheckpoint(t *testing.T) {
	snap := buildLog(t, 10, DefaultSegmentBytes)
	// The checkpoint says LSN 12 was durable: the log must reach it.
	requireCorrupt(t, snap, Options{After: 12}, "before the checkpoint LSN 12")
	// A torn last record at or below the checkpoint LSN had been synced: corruption.
	name := segmentName(1)
	start, _ := lastRecordSpan(snap[name], 10)
	requireCorrupt(t, snapshot{name: snap[name][:start+3]}, Options{After: 10}, "checkpoint")
	// An empty directory cannot hold records after a checkpoint.
	requireCorrupt(t, snapshot{}, Options{After: 3}, "no segment")
}

// TestCorruptValidRecordOutOfPlace: a valid record with the wrong LSN is never a torn write.
func TestCorruptValidRecordOutOfPlace(t *testing.T) {
	snap := buildLog(t, 3, DefaultSegmentBytes)
	name := segmentName(1)
	b := append(bytes.Clone(snap[name]), encodeRecord(9, 2, 1, []byte("stray"))...)
	requireCorrupt(t, snapshot{name: b}, Options{}, "LSN 9, want 4")
}

// TestRecoverLongRecords replays records longer than the read chunk and checks that a
// smaller MaxRecordBytes on reopen turns a long last record into a torn tail.
func TestRecoverLongRecords(t *testing.T) {
	fs := vfs.NewFaultFS()
	w, _ := mustOpen(t, fs, Options{})
	big := bytes.Repeat([]byte("0123456789abcdef"), (3*readChunkBytes)/16+1)
	for k := range 3 {
		_, err := w.Append(t.Context(), byte(k), [][]byte{big[2-k:]}, false)
		require.NoError(t, err)
	}
	require.NoError(t, w.Close())
	w, got := mustOpen(t, fs, Options{})
	require.Len(t, got, 3)
	for k, r := range got {
		require.Equal(t, big[2-k:], r.Payload)
	}
	require.NoError(t, w.Close())
	w, got = mustOpen(t, fs, Options{MaxRecordBytes: len(big) - 1})
	require.Len(t, got, 2)
	require.Equal(t, uint64(2), w.LastLSN())
	require.NoError(t, w.Close())
}

// TestDurableThroughDetectsLastGroup: a bad last record is a torn tail, unless the caller
// knows it had been durable (Options.DurableThrough, the synced LSN its last checkpoint
// recorded): then it is corruption, for a bit flip and for a lost write alike.
func TestDurableThroughDetectsLastGroup(t *testing.T) {
	const n = 6
	snap := buildLog(t, n, DefaultSegmentBytes)
	name := segmentName(1)
	data := snap[name]
	start, end := lastRecordSpan(data, n)
	flipped := bytes.Clone(data)
	flipped[start+40] ^= 1
	for what, b := range map[string][]byte{"bit flip": flipped, "lost write": data[:start], "cut": data[:end-3]} {
		requireTornTail(t, snapshot{name: b}.restore(t), n-1, what)
		w, _, err := openCollect(t, snapshot{name: b}.restore(t), Options{After: 2, DurableThrough: n})
		require.ErrorIs(t, err, corrupt.ErrCorruption, what)
		require.ErrorContains(t, err, "durable when the last checkpoint was published", what)
		require.Nil(t, w)
	}
	// Up to the known-durable LSN, the log is fine.
	w, got, err := openCollect(t, snapshot{name: data}.restore(t), Options{After: 2, DurableThrough: n})
	require.NoError(t, err)
	requireRecords(t, got, 3, n)
	require.NoError(t, w.Close())
}
