package sgio

import "fmt"

// Online backup messages. A backup is pulled by the client, one piece per request, so the
// client's reading paces the server (backpressure) and every reply is bounded:
//
//	client                                   storage node
//	Backup{Stream: 0, ChunkMax}      ->      starts a backup for this connection
//	                                 <-      BackupChunk{Stream: s, first piece}
//	Backup{Stream: s, ChunkMax}      ->
//	                                 <-      BackupChunk{Stream: s, next piece}
//	...                                      (until a piece of kind BackupKindEnd)
//
// A connection runs at most one backup; closing the connection abandons it (the storage node
// releases its hold on the snapshot). Only an authenticated connection may ask.
//
// Backup body (16 bytes):
//
//	stream u64 | chunk max u32 | reserved u32
//
// BackupChunk body (32 bytes, then the data, zero-padded to 8):
//
//	stream u64 | kind u8 | reserved 3 bytes | data length u32 | num u64 | offset u64 | data
//
// kind: 1 the meta file (num 0), 2 a table's data file (num: table id), 3 a WAL segment
// (num: its first LSN), 0 the end of the backup (no data; num: the snapshot's checkpoint
// LSN, offset: the LSN the copied WAL ends at). Pieces of one file come in offset order and
// the first at offset 0; a piece without data at offset 0 creates an empty file.

// Backup file kinds of BackupChunk. Part of the format; do not change.
const (
	BackupKindEnd  uint8 = 0
	BackupKindMeta uint8 = 1
	BackupKindData uint8 = 2
	BackupKindWAL  uint8 = 3
	// BackupKindMapLog is the store's page-map log (Num: its generation, not 0).
	BackupKindMapLog uint8 = 4
)

// BackupChunkMax is the most data one BackupChunk carries. Part of the format; do not change.
const BackupChunkMax = 1 << 20

// backupOffsetMax bounds a BackupChunk's offset (2^50: beyond any store file).
const backupOffsetMax = 1 << 50

// Backup starts (Stream 0) or continues (the Stream of the first reply) the connection's
// backup: it asks for the next piece, of at most ChunkMax data bytes (0 or more than
// BackupChunkMax: BackupChunkMax).
type Backup struct {
	Stream   uint64
	ChunkMax uint32
}

// Type reports TypeBackup.
func (*Backup) Type() Type { return TypeBackup }

// BodySize reports the encoded body length: 16.
func (*Backup) BodySize() int { return 16 }

// AppendBody appends the encoded body.
func (m *Backup) AppendBody(dst []byte) []byte {
	dst = le64(dst, m.Stream)
	dst = le32(dst, m.ChunkMax)
	return le32(dst, 0)
}

// Parse decodes body.
func (m *Backup) Parse(body []byte) error {
	r := bodyReader{t: TypeBackup, b: body}
	m.Stream = r.u64()
	m.ChunkMax = r.u32()
	r.reserved32()
	return r.done()
}

// Validate accepts any values.
func (*Backup) Validate() error { return nil }

// BackupChunk answers Backup with one piece of one file of the backup, or its end.
type BackupChunk struct {
	Stream uint64 // nonzero
	Kind   uint8  // BackupKind*
	Num    uint64
	Offset uint64
	// Data is the piece's bytes, at most BackupChunkMax; Parse makes it alias the body
	// (valid as long as the body is).
	Data []byte
}

// Type reports TypeBackupChunk.
func (*BackupChunk) Type() Type { return TypeBackupChunk }

// BodySize reports the encoded body length.
func (m *BackupChunk) BodySize() int { return 32 + pad8(len(m.Data)) }

// AppendBody appends the encoded body.
func (m *BackupChunk) AppendBody(dst []byte) []byte {
	start := len(dst)
	dst = le64(dst, m.Stream)
	dst = append(dst, m.Kind, 0, 0, 0)
	dst = le32(dst, uint32(len(m.Data)))
	dst = le64(dst, m.Num)
	dst = le64(dst, m.Offset)
	dst = append(dst, m.Data...)
	return appendPad(dst, start)
}

// Parse decodes body. The data length is checked against BackupChunkMax and the body before
// Data is sliced; nothing is allocated.
func (m *BackupChunk) Parse(body []byte) error {
	r := bodyReader{t: TypeBackupChunk, b: body}
	m.Stream = r.u64()
	m.Kind = r.u8()
	r.reserved8()
	r.reserved16()
	off := r.off
	n := r.u32()
	m.Num = r.u64()
	m.Offset = r.u64()
	if r.err == nil && n > BackupChunkMax {
		r.fail(off, "backup piece of %d bytes, limit %d", n, BackupChunkMax)
	}
	m.Data = r.take(int(n))
	if r.err == nil {
		r.check(m.Validate())
	}
	return r.done()
}

// Validate checks the stream, the kind, the number, the offset and the data's size.
func (m *BackupChunk) Validate() error {
	bad := func(what string) error {
		return fmt.Errorf("sgio: BackupChunk: %s: %w", what, ErrMalformed)
	}
	switch {
	case m.Stream == 0:
		return bad("stream 0")
	case len(m.Data) > BackupChunkMax:
		return bad(fmt.Sprintf("%d data bytes, limit %d", len(m.Data), BackupChunkMax))
	case m.Kind > BackupKindMapLog:
		return bad(fmt.Sprintf("kind %d", m.Kind))
	case m.Kind == BackupKindEnd && (len(m.Data) != 0 || m.Offset < m.Num):
		return bad("end of backup with data, or its WAL ending before its checkpoint")
	case m.Kind == BackupKindMeta && m.Num != 0,
		m.Kind == BackupKindData && (m.Num == 0 || m.Num > 1<<32-1),
		m.Kind == BackupKindWAL && m.Num == 0,
		m.Kind == BackupKindMapLog && m.Num == 0:
		return bad(fmt.Sprintf("kind %d with number %d", m.Kind, m.Num))
	case m.Kind != BackupKindEnd && m.Offset > backupOffsetMax:
		return bad(fmt.Sprintf("offset %d", m.Offset))
	}
	return nil
}
