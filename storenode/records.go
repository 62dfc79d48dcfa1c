package storenode

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/cespare/xxhash/v2"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/commitbody"
	"github.com/weftdb/weft/internal/assert"
	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/logicpage"
	"github.com/weftdb/weft/storenode/wal"
)

// WAL record kinds and payloads of the storage engine. The WAL itself (storenode/wal) frames,
// checksums and orders records; this file says what is inside. All integers little-endian.
//
//	kindCreateTable  table u32 | row bytes u16 | name length u16 | name
//	kindCreateClusterTable (a cluster-managed table, cluster.go)
//	                 table u32 | row bytes u16 | name length u16 | partitions u32
//	                 | stripe pages u32 | partition u32 | reserved u32 | name
//	kindDropTable    table u32
//	kindGrantIDs     table u32 | reserved u32 | next id u64        (the new high-water mark)
//	kindGrantOwner   table u32 | reserved u32 | owner u64 | epoch u64
//	kindCommit       batch hash u64 | the batch's Commit body (commitbody), byte for byte:
//	                 owner u64 | seq u64 | fence count u32 | segment count u32
//	                 | fences {table u32 | reserved u32 | epoch u64}
//	                 | segments {table u32 | row bytes u16 | reserved u16 | page u64
//	                             | data u64 | clear u64 | popcount(data) * row bytes of rows}
//
// A commit record is the batch as the owner sent it (docs/wire.md, "Commit"): the storage
// node's server hands the received body to the WAL as it is (no re-encoding, one copy into
// the WAL's group buffer), and recovery decodes it with commitbody.Decode, the fuzzed decoder
// behind the wire's ViewCommit; there is one format of a commit batch, not one per side, and
// one codec of it, which the engine shares with the wire without importing the wire. The
// engine encodes the same bytes for a batch that came without its body (the embedded
// store), with runs of rows of commitKeepBytesMin or more kept by reference
// (AppendPiecesAsync), not copied.
//
// The batch hash (batchHash: xxhash64 of the fences and the segments as the owner sent them) is
// what the dedup window remembers of an applied batch, so a retry after a restart is told apart
// from a different batch under the same seq. It entered the format with meta version 2.
//
// Commit record versions. Kind 5 (kindCommitV1: owner, seq, hash, segment count, reserved,
// then the segments) was written before the commit record became the wire body; it is
// refused on replay with ErrWALFormat (a log whose commits all lie before the checkpoint, as
// after a clean Close, opens fine: those records are not replayed). Kind 6 is the current
// one. docs/wal.md has the upgrade rule.
//
// Kinds 8 to 11 are the two-phase commit's (records_txn.go).
//
// Every record holds full row images, so replaying a record twice leaves the same state:
// recovery may replay records that a checkpoint already covers.
//
// Part of the format; do not change.
const (
	kindCreateTable byte = 1
	kindDropTable   byte = 2
	kindGrantIDs    byte = 3
	kindGrantOwner  byte = 4
	kindCommitV1    byte = 5 // refused: see above
	kindCommit      byte = 6
	// kindCreateClusterTable creates a cluster-managed table (its layout after the fields of
	// kindCreateTable); entered the format with meta version 5.
	kindCreateClusterTable byte = 7

	// commitHashBytes is the batch hash before the Commit body of a commit record.
	commitHashBytes = 8
	// commitBodyFixedBytes, commitFenceBytes and commitSegmentHeaderBytes are sizes of the
	// Commit body's parts (commitbody): owner, seq and the counts; one fence; a segment's
	// header.
	commitBodyFixedBytes     = commitbody.HeaderBytes
	commitFenceBytes         = commitbody.FenceBytes
	commitSegmentHeaderBytes = commitbody.SegmentHeaderBytes

	// walRecordBytesMax is the engine's WAL record bound (wal.Options.MaxRecordBytes, on
	// append and in recovery and Check): the largest commit record, a Commit body of
	// commitbody.BodyBytesMax (the wire's MaxBodyLimit, the most a server accepts) after its
	// batch hash.
	walRecordBytesMax = commitbody.BodyBytesMax + commitHashBytes
)

// oldCommitRecordError is the error of a first-format commit record (kindCommitV1) at lsn after
// the checkpoint, for recovery and Check alike: not corruption, an upgrade this build does
// not do.
func oldCommitRecordError(lsn uint64) error {
	return fmt.Errorf("%w: WAL record %d is a commit record of the first format (kind %d), which this build does not replay: "+
		"open the store once with the build that wrote it and close it cleanly (Close checkpoints), then open it with this one",
		ErrOldFormat, lsn, kindCommitV1)
}

// batchHash is the identity of a batch's bytes for the dedup window: xxhash64 over its fences
// and segments (table, page, masks, rows) in order. A retry of an applied seq is acknowledged
// again only if its hash is the applied batch's. It reads b only; any goroutine may call it.
func batchHash(b *base.Batch) uint64 {
	var d xxhash.Digest
	d.Reset()
	var hdr [40]byte
	binary.LittleEndian.PutUint32(hdr[0:], uint32(len(b.Fences)))
	binary.LittleEndian.PutUint32(hdr[4:], uint32(len(b.Segments)))
	d.Write(hdr[:8])
	for _, f := range b.Fences {
		binary.LittleEndian.PutUint32(hdr[0:], f.Table)
		binary.LittleEndian.PutUint32(hdr[4:], 0)
		binary.LittleEndian.PutUint64(hdr[8:], f.Epoch)
		d.Write(hdr[:16])
	}
	for i := range b.Segments {
		s := &b.Segments[i]
		binary.LittleEndian.PutUint32(hdr[0:], s.Table)
		binary.LittleEndian.PutUint32(hdr[4:], uint32(len(s.Rows)))
		binary.LittleEndian.PutUint64(hdr[8:], s.Page)
		binary.LittleEndian.PutUint64(hdr[16:], s.Data)
		binary.LittleEndian.PutUint64(hdr[24:], s.Clear)
		d.Write(hdr[:32])
		d.Write(s.Rows)
	}
	return d.Sum64()
}

// appendCommitRecord appends b's commit record, rows copied, to dst: the hash, then the Commit
// body (commitbody's encoders, so the bytes are the wire's). rowBytes gives a table's row size. The
// commit path does not copy the rows (commitPieces); this is for tests and tools.
func appendCommitRecord(dst []byte, b *base.Batch, hash uint64, rowBytes func(table uint32) int) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, hash)
	dst = commitbody.AppendHeader(dst, b.Owner, b.Seq, len(b.Fences), len(b.Segments))
	for _, f := range b.Fences {
		dst = commitbody.AppendFence(dst, f.Table, f.Epoch)
	}
	for i := range b.Segments {
		s := &b.Segments[i]
		dst = commitbody.AppendSegmentHeader(dst, s.Table, rowBytes(s.Table), s.Page, s.Data, s.Clear)
		dst = append(dst, s.Rows...)
	}
	return dst
}

// commitKeepBytesMin is the size from which a piece of a commit record is handed to the WAL
// by reference (kept until the record is written) rather than copied: below it, a copy costs
// less than one more buffer in the write's gather list.
const commitKeepBytesMin = 256

// commitPieces returns b's commit record as WAL pieces in e.pieces: the hash and, when the
// batch carries its received Commit body, that body (copied); else the body encoded here,
// headers in e.scratch (copied by the WAL) and each large run of rows kept. Caller
// holds mu (e.scratch, e.pieces). The pieces are valid until the next call.
func (e *Engine) commitPieces(b *base.Batch, hash uint64) []wal.Piece {
	e.pieces = e.pieces[:0]
	if b.Body != nil {
		// The Batch.Body contract, checked in invariants builds (-race included): the bytes
		// logged are the batch validated and applied, or replay would apply something else.
		assert.That(!assert.Invariants || e.bodyMatches(b), "storenode: Batch.Body is not the encoding of the batch")
		e.scratch = binary.LittleEndian.AppendUint64(e.scratch[:0], hash)
		// Copied, not kept: see Batch.Body.
		e.pieces = append(e.pieces, wal.Piece{Bytes: e.scratch}, wal.Piece{Bytes: b.Body})
		return e.pieces
	}
	// e.scratch is grown once to all it will hold, so the pieces cut from it stay valid.
	need := commitHashBytes + commitBodyFixedBytes + commitFenceBytes*len(b.Fences)
	for i := range b.Segments {
		need += commitSegmentHeaderBytes
		if n := len(b.Segments[i].Rows); n < commitKeepBytesMin {
			need += n
		}
	}
	e.scratch = slices.Grow(e.scratch[:0], need)
	e.scratch = binary.LittleEndian.AppendUint64(e.scratch, hash)
	e.scratch = commitbody.AppendHeader(e.scratch, b.Owner, b.Seq, len(b.Fences), len(b.Segments))
	for _, f := range b.Fences {
		e.scratch = commitbody.AppendFence(e.scratch, f.Table, f.Epoch)
	}
	from := 0 // start of the scratch run not yet in a piece
	for i := range b.Segments {
		s := &b.Segments[i]
		e.scratch = commitbody.AppendSegmentHeader(e.scratch, s.Table, e.tables[s.Table].geo.RowBytes(), s.Page, s.Data, s.Clear)
		if len(s.Rows) < commitKeepBytesMin {
			e.scratch = append(e.scratch, s.Rows...)
			continue
		}
		e.pieces = append(e.pieces, wal.Piece{Bytes: e.scratch[from:]}, wal.Piece{Bytes: s.Rows, Keep: true})
		from = len(e.scratch)
	}
	assert.That(len(e.scratch) == need, "storenode: commit record scratch size")
	e.pieces = append(e.pieces, wal.Piece{Bytes: e.scratch[from:]})
	return e.pieces
}

// bodyMatches reports whether b.Body is the Commit body of b's owner, seq, fences and
// segments, with each table's row size in the segment headers. Caller holds mu (e.tables).
func (e *Engine) bodyMatches(b *base.Batch) bool {
	v, err := commitbody.Decode(b.Body)
	if err != nil || v.Owner != b.Owner || v.Seq != b.Seq || v.FenceCount() != len(b.Fences) || v.SegmentCount() != len(b.Segments) {
		return false
	}
	for i, f := range b.Fences {
		if g := v.Fence(i); g.Table != f.Table || g.Epoch != f.Epoch {
			return false
		}
	}
	var seg base.Segment
	i := 0
	for it := v.Segments(); it.Next(&seg); i++ {
		s := &b.Segments[i]
		t := e.tables[s.Table]
		if seg.Table != s.Table || t == nil || int(seg.RowBytes) != t.geo.RowBytes() || seg.Page != s.Page ||
			seg.Data != s.Data || seg.Clear != s.Clear || !bytes.Equal(seg.Rows, s.Rows) {
			return false
		}
	}
	return true
}

// commitRecord is a decoded kindCommit payload. Fences and segment rows alias the payload.
type commitRecord struct {
	owner, seq uint64
	hash       uint64
	fences     []base.Fence
	segments   []base.Segment
	rowBytes   []int
}

// decodeCommitRecord decodes a kindCommit payload: the hash, then a Commit body checked by
// commitbody.Decode, and every segment against its row size's geometry. Every error wraps
// corrupt.ErrCorruption. rec's slices are reused.
func decodeCommitRecord(p []byte, rec *commitRecord) error {
	if len(p) < commitHashBytes {
		return corrupt.Errorf("storenode: commit record of %d bytes", len(p))
	}
	rec.hash = binary.LittleEndian.Uint64(p)
	v, err := commitbody.Decode(p[commitHashBytes:])
	if err != nil {
		return corrupt.Errorf("storenode: commit record: %w", err)
	}
	rec.owner, rec.seq = v.Owner, v.Seq
	rec.fences = rec.fences[:0]
	for i := range v.FenceCount() {
		f := v.Fence(i)
		rec.fences = append(rec.fences, f)
	}
	rec.segments = rec.segments[:0]
	rec.rowBytes = rec.rowBytes[:0]
	var seg base.Segment
	for it := v.Segments(); it.Next(&seg); {
		r := int(seg.RowBytes)
		g, err := logicpage.NewGeometry(r)
		if err != nil {
			return corrupt.Errorf("storenode: commit record: segment of table %d: %w", seg.Table, err)
		}
		if err := g.CheckSegment(seg); err != nil {
			return corrupt.Errorf("storenode: commit record: segment of table %d page %d: %w", seg.Table, seg.Page, err)
		}
		rec.segments = append(rec.segments, seg)
		rec.rowBytes = append(rec.rowBytes, r)
	}
	return nil
}

func appendCreateRecord(dst []byte, id uint32, rowBytes int, name string) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, id)
	dst = binary.LittleEndian.AppendUint16(dst, uint16(rowBytes))
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(name)))
	return append(dst, name...)
}

func decodeCreateRecord(p []byte) (id uint32, rowBytes int, name string, err error) {
	if len(p) < 8 {
		return 0, 0, "", corrupt.Errorf("storenode: create-table record of %d bytes", len(p))
	}
	id = binary.LittleEndian.Uint32(p)
	rowBytes = int(binary.LittleEndian.Uint16(p[4:]))
	n := int(binary.LittleEndian.Uint16(p[6:]))
	if len(p) != 8+n {
		return 0, 0, "", corrupt.Errorf("storenode: create-table record: name of %d bytes in %d", n, len(p)-8)
	}
	name = string(p[8:])
	if _, gerr := logicpage.NewGeometry(rowBytes); gerr != nil || checkName(name) != nil {
		return 0, 0, "", corrupt.Errorf("storenode: create-table record: table %d %q row size %d", id, name, rowBytes)
	}
	return id, rowBytes, name, nil
}

func appendCreateClusterRecord(dst []byte, id uint32, rowBytes int, name string, cl base.ClusterLayout) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, id)
	dst = binary.LittleEndian.AppendUint16(dst, uint16(rowBytes))
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(name)))
	dst = binary.LittleEndian.AppendUint32(dst, cl.Partitions)
	dst = binary.LittleEndian.AppendUint32(dst, cl.StripePages)
	dst = binary.LittleEndian.AppendUint32(dst, cl.Partition)
	dst = binary.LittleEndian.AppendUint32(dst, 0)
	return append(dst, name...)
}

// decodeCreateClusterRecord decodes a kindCreateClusterTable payload: the table's fields as
// decodeCreateRecord checks them, a valid layout, and a name that is its partition's
// (base.PartitionTableName).
func decodeCreateClusterRecord(p []byte) (id uint32, rowBytes int, name string, cl base.ClusterLayout, err error) {
	if len(p) < 24 {
		return 0, 0, "", cl, corrupt.Errorf("storenode: create-cluster-table record of %d bytes", len(p))
	}
	id = binary.LittleEndian.Uint32(p)
	rowBytes = int(binary.LittleEndian.Uint16(p[4:]))
	n := int(binary.LittleEndian.Uint16(p[6:]))
	cl = base.ClusterLayout{Partitions: binary.LittleEndian.Uint32(p[8:]), StripePages: binary.LittleEndian.Uint32(p[12:]),
		Partition: binary.LittleEndian.Uint32(p[16:])}
	if len(p) != 24+n || binary.LittleEndian.Uint32(p[20:]) != 0 {
		return 0, 0, "", cl, corrupt.Errorf("storenode: create-cluster-table record: name of %d bytes in %d", n, len(p)-24)
	}
	name = string(p[24:])
	if err := checkClusterEntry(rowBytes, name, cl); err != nil {
		return 0, 0, "", cl, corrupt.Errorf("storenode: create-cluster-table record: table %d: %w", id, err)
	}
	return id, rowBytes, name, cl, nil
}

// checkClusterEntry checks a cluster table's row size, name and layout as read from disk.
func checkClusterEntry(rowBytes int, name string, cl base.ClusterLayout) error {
	if _, gerr := logicpage.NewGeometry(rowBytes); gerr != nil || checkName(name) != nil {
		return fmt.Errorf("%q row size %d", name, rowBytes)
	}
	if err := cl.Validate(); err != nil {
		return err
	}
	if _, ok := clusterTableName(name, cl.Partition); !ok {
		return fmt.Errorf("%q is not the name of a table's partition %d", name, cl.Partition)
	}
	return nil
}

func appendDropRecord(dst []byte, id uint32) []byte {
	return binary.LittleEndian.AppendUint32(dst, id)
}

func decodeDropRecord(p []byte) (uint32, error) {
	if len(p) != 4 {
		return 0, corrupt.Errorf("storenode: drop-table record of %d bytes", len(p))
	}
	return binary.LittleEndian.Uint32(p), nil
}

func appendGrantIDsRecord(dst []byte, table uint32, nextID uint64) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, table)
	dst = binary.LittleEndian.AppendUint32(dst, 0)
	return binary.LittleEndian.AppendUint64(dst, nextID)
}

func decodeGrantIDsRecord(p []byte) (table uint32, nextID uint64, err error) {
	if len(p) != 16 {
		return 0, 0, corrupt.Errorf("storenode: id-grant record of %d bytes", len(p))
	}
	return binary.LittleEndian.Uint32(p), binary.LittleEndian.Uint64(p[8:]), nil
}

func appendGrantOwnerRecord(dst []byte, table uint32, owner, epoch uint64) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, table)
	dst = binary.LittleEndian.AppendUint32(dst, 0)
	dst = binary.LittleEndian.AppendUint64(dst, owner)
	return binary.LittleEndian.AppendUint64(dst, epoch)
}

func decodeGrantOwnerRecord(p []byte) (table uint32, owner, epoch uint64, err error) {
	if len(p) != 24 {
		return 0, 0, 0, corrupt.Errorf("storenode: ownership record of %d bytes", len(p))
	}
	return binary.LittleEndian.Uint32(p), binary.LittleEndian.Uint64(p[8:]), binary.LittleEndian.Uint64(p[16:]), nil
}

// checkName accepts 1..64 bytes of [A-Za-z0-9_.-].
func checkName(name string) error {
	if len(name) == 0 || len(name) > 64 {
		return ErrBadName
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-'
		if !ok {
			return ErrBadName
		}
	}
	return nil
}
