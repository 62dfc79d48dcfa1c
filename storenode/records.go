package storenode

import (
	"encoding/binary"
	"math/bits"

	"github.com/cespare/xxhash/v2"

	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/logicpage"
)

// WAL record kinds and payloads of the storage engine. The WAL itself (storenode/wal) frames,
// checksums and orders records; this file says what is inside. All integers little-endian.
//
//	kindCreateTable  table u32 | row bytes u16 | name length u16 | name
//	kindDropTable    table u32
//	kindGrantIDs     table u32 | reserved u32 | next id u64        (the new high-water mark)
//	kindGrantOwner   table u32 | reserved u32 | owner u64 | epoch u64
//	kindCommit       owner u64 | seq u64 | batch hash u64 | segment count u32 | reserved u32
//	                 | segments
//	segment          table u32 | row bytes u16 | reserved u16 | page u64 | data u64 | clear u64
//	                 | popcount(data) * row bytes of rows, in slot order
//
// The batch hash (batchHash: xxhash64 of the fences and the segments as the owner sent them) is
// what the dedup window remembers of an applied batch, so a retry after a restart is told apart
// from a different batch under the same seq. It entered the format with meta version 2.
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
	kindCommit      byte = 5

	segmentHeaderBytes = 32
	commitHeaderBytes  = 32
)

// Segment is one sparse segment of a commit batch: a logical page of one table, the rows of its
// data mask and the slots its clear mask deletes.
type Segment struct {
	Table uint32
	logicpage.Segment
}

// Fence names a table a batch writes and the ownership epoch its owner holds for it.
type Fence struct {
	Table uint32
	Epoch uint64
}

// Batch is one commit batch: the segments of one or more transactions of one owner, applied
// atomically. Seq orders an owner's batches (1, 2, 3, ...); a batch whose seq was already applied
// is acknowledged again without being applied twice.
type Batch struct {
	Owner    uint64
	Seq      uint64
	Fences   []Fence
	Segments []Segment
}

// batchHash is the identity of a batch's bytes for the dedup window: xxhash64 over its fences
// and segments (table, page, masks, rows) in order. A retry of an applied seq is acknowledged
// again only if its hash is the applied batch's. It reads b only; any goroutine may call it.
func batchHash(b *Batch) uint64 {
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

func appendCommitRecord(dst []byte, b *Batch, hash uint64, rowBytes func(table uint32) int) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, b.Owner)
	dst = binary.LittleEndian.AppendUint64(dst, b.Seq)
	dst = binary.LittleEndian.AppendUint64(dst, hash)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(b.Segments)))
	dst = binary.LittleEndian.AppendUint32(dst, 0)
	for i := range b.Segments {
		s := &b.Segments[i]
		dst = binary.LittleEndian.AppendUint32(dst, s.Table)
		dst = binary.LittleEndian.AppendUint16(dst, uint16(rowBytes(s.Table)))
		dst = binary.LittleEndian.AppendUint16(dst, 0)
		dst = binary.LittleEndian.AppendUint64(dst, s.Page)
		dst = binary.LittleEndian.AppendUint64(dst, s.Data)
		dst = binary.LittleEndian.AppendUint64(dst, s.Clear)
		dst = append(dst, s.Rows...)
	}
	return dst
}

// commitRecord is a decoded kindCommit payload. Segment rows alias the payload.
type commitRecord struct {
	owner, seq uint64
	hash       uint64
	segments   []Segment
	rowBytes   []int
}

func decodeCommitRecord(p []byte, rec *commitRecord) error {
	if len(p) < commitHeaderBytes {
		return corrupt.Errorf("storenode: commit record of %d bytes", len(p))
	}
	rec.owner = binary.LittleEndian.Uint64(p[0:])
	rec.seq = binary.LittleEndian.Uint64(p[8:])
	rec.hash = binary.LittleEndian.Uint64(p[16:])
	n := binary.LittleEndian.Uint32(p[24:])
	if binary.LittleEndian.Uint32(p[28:]) != 0 {
		return corrupt.Errorf("storenode: commit record: reserved field not zero")
	}
	p = p[commitHeaderBytes:]
	if uint64(n)*segmentHeaderBytes > uint64(len(p)) {
		return corrupt.Errorf("storenode: commit record claims %d segments in %d bytes", n, len(p))
	}
	rec.segments = rec.segments[:0]
	rec.rowBytes = rec.rowBytes[:0]
	for range n {
		if len(p) < segmentHeaderBytes {
			return corrupt.Errorf("storenode: commit record: truncated segment header")
		}
		var s Segment
		s.Table = binary.LittleEndian.Uint32(p[0:])
		r := int(binary.LittleEndian.Uint16(p[4:]))
		if binary.LittleEndian.Uint16(p[6:]) != 0 {
			return corrupt.Errorf("storenode: commit record: segment of table %d: reserved field not zero", s.Table)
		}
		s.Page = binary.LittleEndian.Uint64(p[8:])
		s.Data = binary.LittleEndian.Uint64(p[16:])
		s.Clear = binary.LittleEndian.Uint64(p[24:])
		p = p[segmentHeaderBytes:]
		g, err := logicpage.NewGeometry(r)
		if err != nil {
			return corrupt.Errorf("storenode: commit record: segment of table %d: %w", s.Table, err)
		}
		rows := bits.OnesCount64(s.Data) * r
		if rows > len(p) {
			return corrupt.Errorf("storenode: commit record: segment of table %d page %d needs %d row bytes, %d left",
				s.Table, s.Page, rows, len(p))
		}
		s.Rows, p = p[:rows:rows], p[rows:]
		if err := g.CheckSegment(s.Segment); err != nil {
			return err
		}
		rec.segments = append(rec.segments, s)
		rec.rowBytes = append(rec.rowBytes, r)
	}
	if len(p) != 0 {
		return corrupt.Errorf("storenode: commit record: %d trailing bytes", len(p))
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
