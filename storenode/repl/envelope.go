package repl

import (
	"encoding/binary"
	"fmt"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/weftdb/weft/internal/corrupt"
)

// The log store's WAL records (docs/wal.md, "Record kinds of a replicated log"). Every raft
// entry is one WAL record whose kind byte is the engine's record kind (or 34, 35) and whose
// payload is the envelope; kinds 32 and 33 are local records of the log store, never entries.
// All integers are little-endian.
//
//	envelope (payload of an entry's record; 24 bytes, then the engine payload, 8-aligned)
//	 0  u64 term, >= 1
//	 8  u64 index, >= 1
//	16  u64 proposal id (0 for kinds 34 and 35)
//	24  n   engine payload (kind 34: the ConfChangeV2; kind 35: empty)
//
//	kindRaftState (32; 40 bytes)
//	 0  u64 term      \
//	 8  u64 vote       > raft's HardState
//	16  u64 commit    /
//	24  u64 compacted index: entries at or below it are gone (the log's dummy entry)
//	32  u64 compacted term: the term of that entry
//
//	kindRaftTruncate (33; 16 bytes)
//	 0  u64 index: every entry record written before this one with an index above it is void,
//	           and the log continues at index+1 (past the last index, or with a term that is
//	           not the entry's: the log is reset there, ApplySnapshot)
//	 8  u64 term of the entry at index
//
// Entry.Data of a normal entry with an engine record is the 16-byte entry header (kind u8,
// 7 zero bytes, proposal u64) followed by the engine payload (EncodeEntryData); an empty
// normal entry (a new leader's) is kind 35; a ConfChangeV2 entry is kind 34 with its Data as
// the payload.
//
// Part of the format; do not change.
const (
	kindRaftState      byte = 32
	kindRaftTruncate   byte = 33
	kindRaftConfChange byte = 34
	kindRaftNoop       byte = 35

	// engineKindMax is the highest kind an engine record may have (kinds 32 and up are the
	// log store's and raft's).
	engineKindMax byte = 31

	envelopeBytes   = 24
	stateBytes      = 40
	truncateBytes   = 16
	entryHeaderSize = 16
)

// EncodeEntryData returns the Data of a normal raft entry carrying an engine record of the
// given kind (1..31) and proposal id: the entry header, then payload.
func EncodeEntryData(kind byte, proposal uint64, payload []byte) []byte {
	b := make([]byte, entryHeaderSize+len(payload))
	b[0] = kind
	binary.LittleEndian.PutUint64(b[8:], proposal)
	copy(b[entryHeaderSize:], payload)
	return b
}

// DecodeEntryData splits the Data of a normal entry into kind, proposal id and engine
// payload (a slice of data). An empty Data is the no-op entry (kind 35).
func DecodeEntryData(data []byte) (kind byte, proposal uint64, payload []byte, err error) {
	if len(data) == 0 {
		return kindRaftNoop, 0, nil, nil
	}
	if len(data) < entryHeaderSize {
		return 0, 0, nil, fmt.Errorf("%w: entry data of %d bytes, shorter than its header", ErrBadEntry, len(data))
	}
	kind = data[0]
	if kind == 0 || kind > engineKindMax {
		return 0, 0, nil, fmt.Errorf("%w: entry data of kind %d", ErrBadEntry, kind)
	}
	for _, c := range data[1:8] {
		if c != 0 {
			return 0, 0, nil, fmt.Errorf("%w: entry header reserved bytes not zero", ErrBadEntry)
		}
	}
	return kind, binary.LittleEndian.Uint64(data[8:]), data[entryHeaderSize:], nil
}

// encodedEntry is an entry as a WAL record: kind, envelope header, engine payload.
type encodedEntry struct {
	kind    byte
	header  [envelopeBytes]byte
	payload []byte
}

// encodeEntry maps a raft entry to its WAL record (ErrBadEntry for an entry the log store
// does not hold: a ConfChange of version 1, a bad entry header, term or index 0).
func encodeEntry(e *raftpb.Entry) (encodedEntry, error) {
	var r encodedEntry
	if e.GetTerm() == 0 || e.GetIndex() == 0 {
		return r, fmt.Errorf("%w: term %d, index %d", ErrBadEntry, e.GetTerm(), e.GetIndex())
	}
	var proposal uint64
	switch e.GetType() {
	case raftpb.EntryNormal:
		kind, id, payload, err := DecodeEntryData(e.GetData())
		if err != nil {
			return r, fmt.Errorf("entry %d: %w", e.GetIndex(), err)
		}
		r.kind, proposal, r.payload = kind, id, payload
	case raftpb.EntryConfChangeV2:
		r.kind, r.payload = kindRaftConfChange, e.GetData()
	default:
		return r, fmt.Errorf("%w: entry %d of type %v (only ConfChangeV2 changes membership)", ErrBadEntry, e.GetIndex(), e.GetType())
	}
	binary.LittleEndian.PutUint64(r.header[0:], e.GetTerm())
	binary.LittleEndian.PutUint64(r.header[8:], e.GetIndex())
	binary.LittleEndian.PutUint64(r.header[16:], proposal)
	return r, nil
}

// envelopeHeader is the envelope's fixed part of an entry record.
type envelopeHeader struct {
	term, index, proposal uint64
}

// decodeEnvelopeHeader checks an entry record's kind and envelope and returns its header.
func decodeEnvelopeHeader(kind byte, payload []byte) (envelopeHeader, error) {
	if len(payload) < envelopeBytes {
		return envelopeHeader{}, corrupt.Errorf("repl: entry record of %d bytes, shorter than its envelope", len(payload))
	}
	h := envelopeHeader{
		term:     binary.LittleEndian.Uint64(payload[0:]),
		index:    binary.LittleEndian.Uint64(payload[8:]),
		proposal: binary.LittleEndian.Uint64(payload[16:]),
	}
	switch {
	case h.term == 0 || h.index == 0:
		return h, corrupt.Errorf("repl: entry record with term %d, index %d", h.term, h.index)
	case kind == 0 || (kind > engineKindMax && kind != kindRaftConfChange && kind != kindRaftNoop):
		return h, corrupt.Errorf("repl: record of kind %d in a log store", kind)
	case (kind == kindRaftConfChange || kind == kindRaftNoop) && h.proposal != 0:
		return h, corrupt.Errorf("repl: kind %d entry %d with proposal %d", kind, h.index, h.proposal)
	case kind == kindRaftNoop && len(payload) != envelopeBytes:
		return h, corrupt.Errorf("repl: no-op entry %d with a payload of %d bytes", h.index, len(payload)-envelopeBytes)
	}
	return h, nil
}

// decodeEntry rebuilds the raft entry of an entry record (kind, envelope). The entry owns its
// Data. Normalised as raft makes them: Term and Index set, Type set only for ConfChangeV2,
// Data nil when empty.
func decodeEntry(kind byte, payload []byte) (*raftpb.Entry, error) {
	h, err := decodeEnvelopeHeader(kind, payload)
	if err != nil {
		return nil, err
	}
	e := &raftpb.Entry{Term: &h.term, Index: &h.index}
	body := payload[envelopeBytes:]
	switch kind {
	case kindRaftNoop:
	case kindRaftConfChange:
		t := raftpb.EntryConfChangeV2
		e.Type = &t
		if len(body) > 0 {
			e.Data = append([]byte(nil), body...)
		}
	default:
		e.Data = EncodeEntryData(kind, h.proposal, body)
	}
	return e, nil
}

// logState is the payload of a kindRaftState record.
type logState struct {
	term, vote, commit          uint64
	compactedIndex, compactTerm uint64
}

func encodeState(s logState) [stateBytes]byte {
	var b [stateBytes]byte
	binary.LittleEndian.PutUint64(b[0:], s.term)
	binary.LittleEndian.PutUint64(b[8:], s.vote)
	binary.LittleEndian.PutUint64(b[16:], s.commit)
	binary.LittleEndian.PutUint64(b[24:], s.compactedIndex)
	binary.LittleEndian.PutUint64(b[32:], s.compactTerm)
	return b
}

func decodeState(b []byte) (logState, error) {
	if len(b) != stateBytes {
		return logState{}, corrupt.Errorf("repl: state record of %d bytes, want %d", len(b), stateBytes)
	}
	s := logState{
		term:           binary.LittleEndian.Uint64(b[0:]),
		vote:           binary.LittleEndian.Uint64(b[8:]),
		commit:         binary.LittleEndian.Uint64(b[16:]),
		compactedIndex: binary.LittleEndian.Uint64(b[24:]),
		compactTerm:    binary.LittleEndian.Uint64(b[32:]),
	}
	return s, nil
}

// truncation is the payload of a kindRaftTruncate record.
type truncation struct {
	index, term uint64
}

func encodeTruncate(t truncation) [truncateBytes]byte {
	var b [truncateBytes]byte
	binary.LittleEndian.PutUint64(b[0:], t.index)
	binary.LittleEndian.PutUint64(b[8:], t.term)
	return b
}

func decodeTruncate(b []byte) (truncation, error) {
	if len(b) != truncateBytes {
		return truncation{}, corrupt.Errorf("repl: truncate record of %d bytes, want %d", len(b), truncateBytes)
	}
	return truncation{index: binary.LittleEndian.Uint64(b[0:]), term: binary.LittleEndian.Uint64(b[8:])}, nil
}
