package storenode

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math/bits"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/commitbody"
	"github.com/weftdb/weft/internal/assert"
	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode/wal"
)

// joinPieces concatenates WAL pieces: the payload the WAL writes.
func joinPieces(ps []wal.Piece) []byte {
	var out []byte
	for _, p := range ps {
		out = append(out, p.Bytes...)
	}
	return out
}

// mixedBatch has segments whose rows are copied (under commitKeepBytesMin) and kept, and a
// clear-only one.
func mixedBatch(table uint32, epoch uint64) *base.Batch {
	rows := checkRows(64, 64, 1, 1)
	return &base.Batch{Owner: testOwner, Seq: 1, Fences: []base.Fence{{Table: table, Epoch: epoch}}, Segments: []base.Segment{
		{Table: table, Page: 0, Data: 1 << 3, Rows: rows[:64]},
		{Table: table, Page: 1, Data: ^uint64(0), Rows: rows},
		{Table: table, Page: 2, Clear: 0b110},
		{Table: table, Page: 3, Data: 0xff, Rows: rows[:8*64]},
		{Table: table, Page: 4, Data: 0b11, Rows: rows[64 : 3*64]},
	}}
}

// TestCommitRecordIsWireBody: a commit record is the batch hash and the wire's Commit body,
// whether the engine encodes it (pieces, large runs of rows kept) or logs the received body
// (copied); the rows it keeps are the batch's own memory, not copies.
func TestCommitRecordIsWireBody(t *testing.T) {
	e, _, info, g := openFault(t, Options{}, testOwner)
	b := mixedBatch(info.ID, g.Epoch)
	msg := &sgio.Commit{Owner: b.Owner, Seq: b.Seq, Fences: []base.Fence{{Table: info.ID, Epoch: g.Epoch}}}
	for _, s := range b.Segments {
		msg.Segments = append(msg.Segments, base.Segment{Table: s.Table, RowBytes: 64, Page: s.Page, Data: s.Data, Clear: s.Clear, Rows: s.Rows})
	}
	body := msg.AppendBody(nil)
	hash := batchHash(b)
	want := binary.LittleEndian.AppendUint64(nil, hash)
	want = append(want, body...)
	require.Equal(t, want, appendCommitRecord(nil, b, hash, func(uint32) int { return 64 }))

	e.mu.Lock()
	pieces := slices.Clone(e.commitPieces(b, hash))
	e.mu.Unlock() // before any require: a failed one must not leave mu held for Close
	require.Equal(t, want, joinPieces(pieces))
	kept := 0
	for _, p := range pieces {
		if p.Keep {
			kept++
			require.GreaterOrEqual(t, len(p.Bytes), commitKeepBytesMin)
			require.True(t, &p.Bytes[0] == &b.Segments[1].Rows[0] || &p.Bytes[0] == &b.Segments[3].Rows[0], "a kept piece is the batch's rows")
		}
	}
	require.Equal(t, 2, kept, "the 4 KiB and 512-byte runs of rows are kept")

	b.Body = body
	e.mu.Lock()
	pieces = slices.Clone(e.commitPieces(b, hash))
	e.mu.Unlock()
	require.Equal(t, want, joinPieces(pieces))
	for _, p := range pieces {
		require.False(t, p.Keep, "a received body is copied by the WAL, not kept")
	}

	var rec commitRecord
	require.NoError(t, decodeCommitRecord(want, &rec))
	require.Equal(t, hash, rec.hash)
	require.Equal(t, b.Fences, rec.fences)
	require.Len(t, rec.segments, len(b.Segments))
	for i := range b.Segments {
		require.Equal(t, b.Segments[i].Page, rec.segments[i].Page)
		require.True(t, bytes.Equal(b.Segments[i].Rows, rec.segments[i].Rows))
		require.Equal(t, 64, rec.rowBytes[i])
	}
}

// TestCommitBodyReplays commits batches with and without their received body, rows copied and
// kept, and checks that recovery replays every row from the records.
func TestCommitBodyReplays(t *testing.T) {
	e, fs, info, g := openFault(t, Options{CheckpointWALBytes: -1}, testOwner)
	_, _, err := e.AllocIDs(info.ID, testOwner, g.Epoch, 8)
	require.NoError(t, err)
	b1 := mixedBatch(info.ID, g.Epoch)
	b1.Seq = g.LastSeq + 1
	commitWait(t, e, b1)
	b2 := mixedBatch(info.ID, g.Epoch)
	b2.Seq = b1.Seq + 1
	rows := checkRows(64, 64, 9, 9)
	b2.Segments[1].Rows = rows
	msg := &sgio.Commit{Owner: b2.Owner, Seq: b2.Seq, Fences: []base.Fence{{Table: info.ID, Epoch: g.Epoch}}}
	for _, s := range b2.Segments {
		msg.Segments = append(msg.Segments, base.Segment{Table: s.Table, RowBytes: 64, Page: s.Page, Data: s.Data, Clear: s.Clear, Rows: s.Rows})
	}
	b2.Body = msg.AppendBody(nil)
	// The segments' rows alias the body, as the server's do.
	v, err := commitbody.Decode(b2.Body)
	require.NoError(t, err)
	var seg base.Segment
	for i, it := 0, v.Segments(); it.Next(&seg); i++ {
		b2.Segments[i].Rows = seg.Rows
	}
	commitWait(t, e, b2)
	// kill -9: no checkpoint, so the WAL replays both records.
	fs.SetCrashPoint(0)
	e.Close()
	fs.CrashKeepAll()
	e = openEngine(t, Options{Dir: "db", FS: fs, Logger: quietLogger, CheckpointInterval: -1})
	defer e.Close()
	for slot := range uint64(64) {
		row, ok := readRow(t, e, info.ID, 64+slot)
		require.True(t, ok)
		require.Equal(t, rows[slot*64:(slot+1)*64], row, "slot %d of page 1", slot)
	}
	_, ok := readRow(t, e, info.ID, 2*64+1)
	require.False(t, ok)
	row, ok := readRow(t, e, info.ID, 3*64+7)
	require.True(t, ok)
	require.Equal(t, b2.Segments[3].Rows[7*64:8*64], row)
}

// oldCommitRecordStore makes a store in db on a fault FS with one table and, after its
// checkpoint, a commit record of the first format (kind 5) as that format wrote it: owner, seq,
// hash, segment count, reserved, one clear-only segment. It returns the record's LSN.
func oldCommitRecordStore(t *testing.T) (*vfs.FaultFS, Options, uint64) {
	t.Helper()
	fs := vfs.NewFaultFS()
	opts := Options{Dir: "db", FS: fs, CheckpointInterval: -1, CheckpointWALBytes: -1, Logger: quietLogger, ExpireLeasesAtOpen: true}
	e := openEngine(t, opts)
	info, err := e.CreateTable("t", 64)
	require.NoError(t, err)
	require.NoError(t, e.Close())
	v1 := binary.LittleEndian.AppendUint64(nil, testOwner)
	v1 = binary.LittleEndian.AppendUint64(v1, 1)
	v1 = binary.LittleEndian.AppendUint64(v1, 0)
	v1 = binary.LittleEndian.AppendUint32(v1, 1)
	v1 = binary.LittleEndian.AppendUint32(v1, 0)
	v1 = commitbody.AppendSegmentHeader(v1, info.ID, 64, 0, 0, 1)
	log, err := wal.Open(fs, walDir("db"), wal.Options{}, nil)
	require.NoError(t, err)
	lsn, err := log.Append(context.Background(), kindCommitV1, [][]byte{v1}, false)
	require.NoError(t, err)
	require.NoError(t, log.Close())
	return fs, opts, lsn
}

// checkpointAt rewrites db's meta so that its checkpoint LSN is lsn (what a clean Close leaves).
func checkpointAt(t *testing.T, fs *vfs.FaultFS, lsn uint64) {
	t.Helper()
	mb, err := fs.ReadFile("db/" + metaName)
	require.NoError(t, err)
	m, err := decodeMeta(mb)
	require.NoError(t, err)
	m.ckptLSN, m.syncedLSN = lsn, max(m.syncedLSN, lsn)
	require.NoError(t, fs.WriteFile("db/"+metaName, encodeMeta(m)))
}

// TestOldCommitRecordRefused: a commit record of the first format (kind 5) after the
// checkpoint stops Open with ErrOldFormat, not corruption; one at or before the checkpoint (a
// store the older build closed cleanly) is never replayed, so the store opens.
func TestOldCommitRecordRefused(t *testing.T) {
	fs, opts, lsn := oldCommitRecordStore(t)

	_, err := Open(opts)
	require.ErrorIs(t, err, ErrOldFormat)
	require.False(t, errors.Is(err, corrupt.ErrCorruption), "an old format is not corruption: %v", err)
	require.ErrorContains(t, err, "kind 5")

	// The same record at the checkpoint LSN (what a clean Close of the older build leaves)
	// is not replayed: the store opens.
	checkpointAt(t, fs, lsn)
	e := openEngine(t, opts)
	require.NoError(t, e.Close())
}

// TestCheckOldCommitRecord: Check reports a first-format commit record after the checkpoint as
// Open does (ErrOldFormat, not damage: the store is intact, this build just cannot replay it),
// and finds nothing at all in one at the checkpoint LSN (not replayed).
func TestCheckOldCommitRecord(t *testing.T) {
	fs, _, lsn := oldCommitRecordStore(t)

	rep, err := Check(context.Background(), "db", CheckOptions{FS: fs})
	require.ErrorIs(t, err, ErrOldFormat, "report: %+v", rep)
	require.ErrorContains(t, err, "kind 5")

	checkpointAt(t, fs, lsn)
	rep = requireChecked(t, context.Background(), "db", CheckOptions{FS: fs})
	require.False(t, rep.Damaged(), "%+v", rep.Findings)
}

// TestCommitBodyAtLimit: a Commit body of commitbody.BodyBytesMax bytes (the most a server may
// be configured to accept, MaxBody) commits and replays: its WAL record is the body plus the
// batch hash, so the WAL's record bound must leave room for the hash.
func TestCommitBodyAtLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("a 64 MiB batch")
	}
	const rowBytes, full, last = 3432, 305, 31 // 40 + 305*(32+64*3432) + 32+31*3432 = 64 MiB
	e, fs, _, _ := openFault(t, Options{CheckpointWALBytes: -1, CacheBytes: 256 << 20}, testOwner)
	info, err := e.CreateTable("big", rowBytes)
	require.NoError(t, err)
	g := acquire(t, e, info.ID, testOwner, 0)
	_, _, err = e.AllocIDs(info.ID, testOwner, g.Epoch, full+1)
	require.NoError(t, err)
	msg := &sgio.Commit{Owner: testOwner, Seq: g.LastSeq + 1, Fences: []base.Fence{{Table: info.ID, Epoch: g.Epoch}}}
	for p := range uint64(full + 1) {
		data := ^uint64(0)
		if p == full {
			data = 1<<last - 1
		}
		rows := bytes.Repeat([]byte{byte(p%256 + 1)}, bits.OnesCount64(data)*rowBytes)
		msg.Segments = append(msg.Segments, base.Segment{Table: info.ID, RowBytes: rowBytes, Page: p, Data: data, Rows: rows})
	}
	body := msg.AppendBody(nil)
	require.Equal(t, commitbody.BodyBytesMax, len(body))
	v, err := commitbody.Decode(body)
	require.NoError(t, err)
	b := &base.Batch{Owner: v.Owner, Seq: v.Seq, Fences: []base.Fence{{Table: info.ID, Epoch: g.Epoch}}, Body: body}
	var seg base.Segment
	for it := v.Segments(); it.Next(&seg); {
		b.Segments = append(b.Segments, base.Segment{Table: seg.Table, Page: seg.Page, Data: seg.Data, Rows: seg.Rows})
	}
	commitWait(t, e, b)
	fs.SetCrashPoint(0)
	e.Close()
	fs.CrashKeepAll()
	rep := requireChecked(t, context.Background(), "db", CheckOptions{FS: fs})
	require.False(t, rep.Damaged(), "%+v", rep.Findings)
	e = openEngine(t, Options{Dir: "db", FS: fs, Logger: quietLogger, CheckpointInterval: -1, CacheBytes: 256 << 20})
	defer e.Close()
	row, ok := readRow(t, e, info.ID, full*64+last-1)
	require.True(t, ok)
	require.Equal(t, bytes.Repeat([]byte{byte(full%256 + 1)}, rowBytes), row)
}

// TestCommitBodyMismatch: under invariants (-race, weft_invariants) a Batch whose Body is not
// its encoding (a row changed, a trailing segment the batch lacks) stops the commit before it
// is logged; the server's batches, decoded from their bodies, always match.
func TestCommitBodyMismatch(t *testing.T) {
	e, _, info, g := openFault(t, Options{CheckpointWALBytes: -1}, testOwner)
	_, _, err := e.AllocIDs(info.ID, testOwner, g.Epoch, 8)
	require.NoError(t, err)
	build := func(seq uint64) *base.Batch {
		b := mixedBatch(info.ID, g.Epoch)
		b.Seq = seq
		msg := &sgio.Commit{Owner: b.Owner, Seq: b.Seq, Fences: []base.Fence{{Table: info.ID, Epoch: g.Epoch}}}
		for _, s := range b.Segments {
			msg.Segments = append(msg.Segments, base.Segment{Table: s.Table, RowBytes: 64, Page: s.Page, Data: s.Data, Clear: s.Clear, Rows: s.Rows})
		}
		b.Body = msg.AppendBody(nil)
		return b
	}
	require.True(t, e.bodyMatches(build(g.LastSeq+1)))
	b := build(g.LastSeq + 1)
	b.Segments[1].Rows = checkRows(64, 64, 5, 5) // the body still has the old rows
	require.False(t, e.bodyMatches(b))
	b = build(g.LastSeq + 1)
	b.Segments = b.Segments[:len(b.Segments)-1] // the body has one more segment
	require.False(t, e.bodyMatches(b))
	if !assert.Invariants {
		return
	}
	require.Panics(t, func() { _, _ = e.CommitWait(b) })
}
