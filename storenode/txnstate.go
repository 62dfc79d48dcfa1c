package storenode

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/checksum"
	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/internal/vfs"
)

// The transaction state sidecar of a replica's checkpoint (docs/storage.md, "The transaction
// state sidecar"; docs/replication.md 1.2). A standalone checkpoint carries the live
// two-phase commit state and the move states by re-logging them after its LSN (carryTxns,
// carryPrepared, carryMoves); a replica's log is the group's, so its checkpoint cannot append
// to it. It writes that state instead to txnstate-<index> (16 hex digits, the checkpoint
// index), which its meta file (version 6) names. All integers little-endian.
//
//	header, 32 bytes: magic "WEFTTXNS" 8 | version u32 (1) | reserved u32 |
//	                  checkpoint index u64 | entry count u32 | reserved u32
//	entry, 16 bytes + payload: kind u8 | reserved [3] | payload length u32 | LSN u64 |
//	                  payload, zero-padded to a multiple of 8
//	trailer, 8 bytes: crc32c u32 over everything before it | reserved u32
//
// An entry's payload is the WAL record of its kind, byte for byte, and Open applies it as
// replay applies that record (applyRecord), at the entry's LSN:
//
//	8   kindTxnPrepare  a prepared part: its prepare record (LSN: the prepare's)
//	11  kindTxnApply    a part applied, not yet reported (LSN: the apply's)
//	9   kindTxnDecide   a decision kept, with its reports (LSN: the decide's); kept as is,
//	                    even an abort every participant reported (forgotten by the sweep's
//	                    entry, as on the replicas that did not reopen)
//	137 forgotten       a decision forgotten and still remembered (txnForgot): a decide
//	                    record of count 64, every participant reported, lease 0 (LSN: the
//	                    checkpoint index); in the order forgotten, oldest first, the newest
//	                    Options.MaxTxns (Open notes the rest lost: txnForgotLost)
//	16  kindMoveState   a table's move state other than live (LSN: the checkpoint index)
//
// Entries come parts first (8 and 11, ascending id), then decisions (ascending id), then the
// forgotten decisions (in their order), then move states (ascending table id); an id appears
// once per group; LSNs are in 1..index. Open applies parts and move states as replay applies
// their records (applyRecord), keeps decisions as they were (keepDecision) and remembers the
// forgotten ones in their order (rememberForgotten).
//
// Invariants:
//   - the sidecar is the state of the checkpoint's snapshot, taken in the same hold of mu as
//     the catalog and dedup table (snapshotTxnState), so it is exactly the state at the index.
//   - it is fsynced, and its directory entry (the checkpoint's directory fsync, syncDataFiles),
//     before the meta file that names it is published; the sidecars of older checkpoints are
//     removed only after (removeTxnStates), a failed or deferred checkpoint's at the next
//     checkpoint or Open.
//   - a meta file that names a sidecar is refused at Open unless the sidecar decodes whole for
//     its index: a lost or damaged one is corruption, never an empty state.
//
// Part of the format; do not change.
const (
	txnStateMagic        = "WEFTTXNS"
	txnStateVersion      = 1
	txnStateHeaderBytes  = 32
	txnStateEntryBytes   = 16
	txnStateTrailerBytes = 8
	txnStatePrefix       = "txnstate-"
	// txnStateForgotten is the entry kind of a forgotten decision (a sidecar's own kind:
	// the decide record's, high bit set).
	txnStateForgotten byte = 0x80 | kindTxnDecide
)

// txnStateBytesMax bounds a sidecar's size before it is read into memory: the prepared
// batches (Options.MaxTxnBytes) dominate it.
const txnStateBytesMax = 1 << 36

// txnStateWriteBytes is how much of a sidecar is encoded before it is written: prepared
// batches (up to Options.MaxTxnBytes) are not gathered into one buffer.
const txnStateWriteBytes = 1 << 20

// txnStateEntry is one entry of a sidecar: a record payload of kind at lsn. A prepared part's
// payload is the part's own prepare record (immutable once made: finishPart drops the
// reference, never the bytes).
type txnStateEntry struct {
	kind    byte
	lsn     uint64
	payload []byte
}

func txnStateName(index uint64) string { return fmt.Sprintf("%s%016x", txnStatePrefix, index) }

// parseTxnStateName returns the index of a sidecar's file name.
func parseTxnStateName(n string) (uint64, bool) {
	hex, ok := strings.CutPrefix(n, txnStatePrefix)
	if !ok || len(hex) != 16 {
		return 0, false
	}
	index, err := strconv.ParseUint(hex, 16, 64)
	return index, err == nil && index != 0
}

// txnStateGroup orders the entries: parts, decisions, move states.
func txnStateGroup(kind byte) int {
	switch kind {
	case kindTxnPrepare, kindTxnApply:
		return 0
	case kindTxnDecide:
		return 1
	case txnStateForgotten:
		return 2
	case kindMoveState:
		return 3
	}
	return -1
}

// snapshotTxnState returns the two-phase commit state and the move states as sidecar entries
// of the checkpoint at index, in no order (sortTxnState orders them). Caller holds mu, in the
// checkpoint's snapshot hold: O(parts + decisions + MaxTxns forgotten + moves), as carryTxns.
func (e *Engine) snapshotTxnState(index uint64) []txnStateEntry {
	out := make([]txnStateEntry, 0, len(e.txnParts)+len(e.txnDecisions)+len(e.moves))
	for _, p := range e.txnParts {
		if p.decision == base.DecisionNone {
			out = append(out, txnStateEntry{kind: kindTxnPrepare, lsn: max(p.lsn, 1), payload: p.rec})
			continue
		}
		out = append(out, txnStateEntry{kind: kindTxnApply, lsn: max(p.lsn, 1),
			payload: appendTxnApplyRecord(nil, p.id, p.decision, p.index, p.primary)})
	}
	for id, d := range e.txnDecisions {
		out = append(out, txnStateEntry{kind: kindTxnDecide, lsn: max(d.lsn, 1),
			payload: appendTxnDecideRecord(nil, id, d.d, d.count, d.lease, d.reported)})
	}
	// The newest MaxTxns forgotten decisions, in their order (as carryTxns, which bounds this
	// hold the same way). Not filtered by age: a replica drops none by it (expireForgotten).
	for _, q := range e.txnForgotQ[max(0, len(e.txnForgotQ)-e.opts.MaxTxns):] {
		if f, ok := e.txnForgot[q.id]; ok && f.seq == q.seq {
			out = append(out, txnStateEntry{kind: txnStateForgotten, lsn: index,
				payload: appendTxnDecideRecord(nil, q.id, f.d, txnParticipantsMax, 0, ^uint64(0))})
		}
	}
	for id, m := range e.moves {
		if m.state != MoveLive {
			out = append(out, txnStateEntry{kind: kindMoveState, lsn: index, payload: appendMoveStateRecord(nil, id, m.state, m.epoch)})
		}
	}
	return out
}

// sortTxnState puts entries in the file's order (parts, decisions, forgotten decisions as
// listed, move states; each but the forgotten by id). A transaction id is the payload's first
// 16 bytes, a table id its first 4 (move state).
func sortTxnState(entries []txnStateEntry) {
	slices.SortStableFunc(entries, func(a, b txnStateEntry) int {
		if c := cmp.Compare(txnStateGroup(a.kind), txnStateGroup(b.kind)); c != 0 {
			return c
		}
		if a.kind == txnStateForgotten {
			return 0 // in the order forgotten
		}
		if a.kind == kindMoveState {
			return cmp.Compare(binary.LittleEndian.Uint32(a.payload), binary.LittleEndian.Uint32(b.payload))
		}
		return strings.Compare(string(a.payload[:txnIDBytes]), string(b.payload[:txnIDBytes]))
	})
}

// encodeTxnState encodes a sidecar of entries (in the file's order) for index, handing it to
// emit in pieces of about txnStateWriteBytes (each valid until emit returns).
func encodeTxnState(index uint64, entries []txnStateEntry, emit func([]byte) error) error {
	buf := make([]byte, 0, txnStateWriteBytes)
	var crc uint32
	started := false
	flush := func() error {
		if started {
			crc = checksum.Update(crc, buf)
		} else {
			crc, started = checksum.Of(buf), true
		}
		err := emit(buf)
		buf = buf[:0]
		return err
	}
	buf = append(buf, txnStateMagic...)
	buf = binary.LittleEndian.AppendUint32(buf, txnStateVersion)
	buf = binary.LittleEndian.AppendUint32(buf, 0)
	buf = binary.LittleEndian.AppendUint64(buf, index)
	buf = binary.LittleEndian.AppendUint32(buf, uint32(len(entries)))
	buf = binary.LittleEndian.AppendUint32(buf, 0)
	for _, ent := range entries {
		buf = append(buf, ent.kind, 0, 0, 0)
		buf = binary.LittleEndian.AppendUint32(buf, uint32(len(ent.payload)))
		buf = binary.LittleEndian.AppendUint64(buf, ent.lsn)
		for p := ent.payload; len(p) > 0; {
			if len(buf) >= txnStateWriteBytes {
				if err := flush(); err != nil {
					return err
				}
			}
			n := min(len(p), txnStateWriteBytes-len(buf))
			buf = append(buf, p[:n]...)
			p = p[n:]
		}
		buf = append(buf, make([]byte, 8)[:pad8(len(ent.payload))-len(ent.payload)]...)
		if len(buf) >= txnStateWriteBytes {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if len(buf) > 0 || !started {
		if err := flush(); err != nil {
			return err
		}
	}
	buf = binary.LittleEndian.AppendUint32(buf, crc)
	buf = binary.LittleEndian.AppendUint32(buf, 0)
	return emit(buf)
}

// decodeTxnState decodes a sidecar's bytes, every entry's payload checked with its record's
// decoder; the payloads alias b. Every error wraps corrupt.ErrCorruption, and its offset is in
// the message.
func decodeTxnState(b []byte) (index uint64, entries []txnStateEntry, err error) {
	if len(b) < txnStateHeaderBytes+txnStateTrailerBytes {
		return 0, nil, corrupt.Errorf("storenode: txnstate: %d bytes: torn or truncated", len(b))
	}
	body := b[:len(b)-txnStateTrailerBytes]
	if got, want := checksum.Of(body), binary.LittleEndian.Uint32(b[len(body):]); got != want {
		return 0, nil, corrupt.Errorf("storenode: txnstate: offset %d: checksum %#08x stored, %#08x computed over bytes [0, %d): torn or damaged",
			len(body), want, got, len(body))
	}
	if binary.LittleEndian.Uint32(b[len(b)-4:]) != 0 {
		return 0, nil, corrupt.Errorf("storenode: txnstate: offset %d: reserved trailer field not zero", len(b)-4)
	}
	if string(b[:8]) != txnStateMagic {
		return 0, nil, corrupt.Errorf("storenode: txnstate: offset 0: bad magic %q", b[:8])
	}
	if v := binary.LittleEndian.Uint32(b[8:]); v != txnStateVersion {
		return 0, nil, corrupt.Errorf("storenode: txnstate: offset 8: version %d, want %d", v, txnStateVersion)
	}
	index = binary.LittleEndian.Uint64(b[16:])
	n := uint64(binary.LittleEndian.Uint32(b[24:]))
	if binary.LittleEndian.Uint32(b[12:]) != 0 || binary.LittleEndian.Uint32(b[28:]) != 0 || index == 0 {
		return 0, nil, corrupt.Errorf("storenode: txnstate: offset 0: bad header (index %d)", index)
	}
	if n*txnStateEntryBytes > uint64(len(body)-txnStateHeaderBytes) {
		return 0, nil, corrupt.Errorf("storenode: txnstate: %d entries in %d bytes", n, len(body))
	}
	entries = make([]txnStateEntry, 0, n) // bounded by the bytes just above
	parts := make(map[base.TxnID]struct{})
	decisions := make(map[base.TxnID]struct{})
	forgotten := make(map[base.TxnID]struct{})
	moves := make(map[uint32]struct{})
	off := txnStateHeaderBytes
	group := 0
	for i := range n {
		if len(body)-off < txnStateEntryBytes {
			return 0, nil, corrupt.Errorf("storenode: txnstate: offset %d: entry %d truncated", off, i)
		}
		h := body[off : off+txnStateEntryBytes]
		ent := txnStateEntry{kind: h[0], lsn: binary.LittleEndian.Uint64(h[8:])}
		size := uint64(binary.LittleEndian.Uint32(h[4:]))
		g := txnStateGroup(ent.kind)
		switch {
		case g < 0 || h[1] != 0 || h[2] != 0 || h[3] != 0:
			return 0, nil, corrupt.Errorf("storenode: txnstate: offset %d: entry %d of kind %d (reserved %x)", off, i, h[0], h[1:4])
		case g < group:
			return 0, nil, corrupt.Errorf("storenode: txnstate: offset %d: entry %d of kind %d after a later group", off, i, ent.kind)
		case ent.lsn == 0 || ent.lsn > index:
			return 0, nil, corrupt.Errorf("storenode: txnstate: offset %d: entry %d at LSN %d, checkpoint index %d", off, i, ent.lsn, index)
		case uint64(pad8(int(size))) > uint64(len(body)-off-txnStateEntryBytes):
			return 0, nil, corrupt.Errorf("storenode: txnstate: offset %d: entry %d of %d bytes in %d", off, i, size, len(body)-off-txnStateEntryBytes)
		}
		group = g
		off += txnStateEntryBytes
		ent.payload = body[off : off+int(size)]
		for _, c := range body[off+int(size) : off+pad8(int(size))] {
			if c != 0 {
				return 0, nil, corrupt.Errorf("storenode: txnstate: offset %d: entry %d: padding not zero", off, i)
			}
		}
		if err := checkTxnStateEntry(&ent, parts, decisions, forgotten, moves); err != nil {
			return 0, nil, fmt.Errorf("storenode: txnstate: offset %d: entry %d: %w", off-txnStateEntryBytes, i, err)
		}
		off += pad8(int(size))
		entries = append(entries, ent)
	}
	if off != len(body) {
		return 0, nil, corrupt.Errorf("storenode: txnstate: offset %d: %d trailing bytes", off, len(body)-off)
	}
	return index, entries, nil
}

// checkTxnStateEntry decodes one entry's payload with its record's decoder and checks its id
// is new in its group.
func checkTxnStateEntry(ent *txnStateEntry, parts, decisions, forgotten map[base.TxnID]struct{}, moves map[uint32]struct{}) error {
	var (
		id   base.TxnID
		seen map[base.TxnID]struct{}
	)
	switch ent.kind {
	case kindTxnPrepare:
		var pr txnPrepareRecord
		if err := decodeTxnPrepareRecord(ent.payload, &pr); err != nil {
			return err
		}
		if pr.commit.owner == 0 || pr.commit.owner == MoveWriter || pr.commit.seq == 0 {
			return corrupt.Errorf("storenode: prepare of owner %d seq %d", pr.commit.owner, pr.commit.seq)
		}
		id, seen = pr.id, parts
	case kindTxnApply:
		var err error
		if id, _, _, _, err = decodeTxnApplyRecord(ent.payload); err != nil {
			return err
		}
		seen = parts
	case kindTxnDecide:
		var err error
		if id, _, _, _, _, err = decodeTxnDecideRecord(ent.payload); err != nil {
			return err
		}
		seen = decisions
	case txnStateForgotten:
		var (
			count    uint16
			lease    int64
			reported uint64
			err      error
		)
		if id, _, count, lease, reported, err = decodeTxnDecideRecord(ent.payload); err != nil {
			return err
		}
		if count != txnParticipantsMax || lease != 0 || reported != ^uint64(0) {
			return corrupt.Errorf("storenode: forgotten decision of %v: count %d, lease %d, reported %#x", id, count, lease, reported)
		}
		seen = forgotten
	case kindMoveState:
		table, s, _, err := decodeMoveStateRecord(ent.payload)
		if err != nil {
			return err
		}
		if _, ok := moves[table]; ok || s == MoveLive || table == 0 {
			return corrupt.Errorf("storenode: move state %v of table %d (twice, live or no table)", s, table)
		}
		moves[table] = struct{}{}
		return nil
	}
	if _, ok := seen[id]; ok {
		return corrupt.Errorf("storenode: transaction %v twice", id)
	}
	seen[id] = struct{}{}
	return nil
}

// writeTxnState writes and fsyncs the checkpoint's sidecar (its directory entry is made
// durable by the checkpoint's directory fsync, before the meta file is published) and notes
// it for removal once a later checkpoint is published. Called by the checkpoint, under ckptMu,
// without mu.
func (e *Engine) writeTxnState(index uint64, entries []txnStateEntry) error {
	sortTxnState(entries)
	name := path.Join(e.dir, txnStateName(index))
	f, err := e.fs.Create(name)
	if err != nil {
		return fmt.Errorf("storenode: checkpoint: create %s: %w", name, err)
	}
	e.repl.txnStates = append(e.repl.txnStates, index)
	var off int64
	err = encodeTxnState(index, entries, func(b []byte) error {
		_, err := f.WriteAt(b, off)
		off += int64(len(b))
		return err
	})
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("storenode: checkpoint: write %s: %w", name, err)
	}
	return nil
}

// removeTxnStates removes the sidecars written before the one the meta file now names
// (published): older checkpoints', and those of checkpoints that did not publish. A failed
// remove is logged: the file is garbage, not state (Open removes it). Under ckptMu.
func (e *Engine) removeTxnStates(published uint64) {
	for _, index := range e.repl.txnStates {
		if index == published {
			continue
		}
		if err := e.fs.Remove(path.Join(e.dir, txnStateName(index))); err != nil && !isNotExist(err) {
			e.opts.Logger.Warn("storenode: remove old transaction state sidecar", "index", index, "err", err)
		}
	}
	e.repl.txnStates = append(e.repl.txnStates[:0], published)
}

// readTxnState reads and decodes the sidecar of index in dir; a missing, torn or damaged one
// is corruption naming the file, with the offset of the damage.
func readTxnState(fs vfs.FS, dir string, index uint64) ([]txnStateEntry, error) {
	name := path.Join(dir, txnStateName(index))
	b, err := readTxnStateFile(fs, name)
	if err != nil {
		return nil, err
	}
	got, entries, err := decodeTxnState(b)
	if err != nil {
		return nil, fmt.Errorf("storenode: %s: %w", name, err)
	}
	if got != index {
		return nil, corrupt.Errorf("storenode: %s: offset 16: holds the state of index %d, the meta file names %d", name, got, index)
	}
	return entries, nil
}

func readTxnStateFile(fs vfs.FS, name string) ([]byte, error) {
	f, err := fs.Open(name)
	if err != nil {
		if isNotExist(err) {
			return nil, corrupt.Errorf("storenode: %s is missing: the meta file names it (the checkpoint's transaction state)", name)
		}
		return nil, fmt.Errorf("storenode: open %s: %w", name, err)
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return nil, fmt.Errorf("storenode: size of %s: %w", name, err)
	}
	if size > txnStateBytesMax {
		return nil, corrupt.Errorf("storenode: %s: size %d", name, size)
	}
	if size > txnStateStreamBytes {
		// Checked by streaming first: a damaged (or sparse) file costs no allocation of its size.
		if err := precheckTxnState(f, size); err != nil {
			return nil, fmt.Errorf("storenode: %s: %w", name, err)
		}
	}
	b := make([]byte, size)
	if n, err := f.ReadAt(b, 0); n != len(b) {
		if err == nil || errors.Is(err, io.EOF) {
			return nil, corrupt.Errorf("storenode: %s: %d bytes read of %d: the file shrank", name, n, size)
		}
		return nil, fmt.Errorf("storenode: read %s: %w", name, err)
	}
	return b, nil
}

// txnStateStreamBytes is the size above which readTxnStateFile checks a sidecar's magic and
// checksum by streaming it, txnStateWriteBytes at a time, before reading it into memory.
const txnStateStreamBytes = 1 << 20

// precheckTxnState checks the magic and checksum of the sidecar f of size bytes with
// decodeTxnState's errors, reading it txnStateWriteBytes at a time.
func precheckTxnState(f vfs.File, size int64) error {
	buf := make([]byte, txnStateWriteBytes)
	read := func(b []byte, off int64) error {
		n, err := f.ReadAt(b, off)
		if n == len(b) {
			return nil
		}
		if err == nil || errors.Is(err, io.EOF) {
			return corrupt.Errorf("storenode: txnstate: %d bytes read at %d of %d: the file shrank", n, off, size)
		}
		return fmt.Errorf("storenode: read txnstate at %d: %w", off, err)
	}
	body := size - txnStateTrailerBytes
	var crc uint32
	for off := int64(0); off < body; {
		b := buf[:min(int64(len(buf)), body-off)]
		if err := read(b, off); err != nil {
			return err
		}
		if off == 0 {
			if string(b[:len(txnStateMagic)]) != txnStateMagic {
				return corrupt.Errorf("storenode: txnstate: offset 0: bad magic %q", b[:len(txnStateMagic)])
			}
			crc = checksum.Of(b)
		} else {
			crc = checksum.Update(crc, b)
		}
		off += int64(len(b))
	}
	tr := buf[:txnStateTrailerBytes]
	if err := read(tr, body); err != nil {
		return err
	}
	if want := binary.LittleEndian.Uint32(tr); crc != want {
		return corrupt.Errorf("storenode: txnstate: offset %d: checksum %#08x stored, %#08x computed over bytes [0, %d): torn or damaged",
			body, want, crc, body)
	}
	return nil
}

// loadTxnState applies the sidecar the meta file names (index) at Open, before the WAL's
// replay: each entry as replay applies its record (applyRecord), parts before the decisions
// that count them. Caller owns the engine (not shared yet), replaying set.
func (e *Engine) loadTxnState(index uint64) error {
	entries, err := readTxnState(e.fs, e.dir, index)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, ent := range entries {
		var err error
		switch ent.kind {
		case kindTxnDecide:
			id, d, count, lease, reported, _ := decodeTxnDecideRecord(ent.payload) // checked by decodeTxnState
			e.keepDecision(id, d, count, lease, reported, ent.lsn)
		case txnStateForgotten:
			id, d, _, _, _, _ := decodeTxnDecideRecord(ent.payload)
			e.rememberForgotten(id, d, e.opts.Now())
		default:
			err = e.applyRecord(ent.kind, ent.payload, ent.lsn)
		}
		if err != nil {
			return fmt.Errorf("storenode: %s: entry %d: %w", path.Join(e.dir, txnStateName(index)), i, err)
		}
	}
	return nil
}
