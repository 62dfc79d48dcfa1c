// Package repl replicates a storage node's log with go.etcd.io/raft/v3 (docs/replication.md).
// This stage holds the log store: raft's Storage over a storenode/wal WAL of its own.
package repl

import (
	"cmp"
	"fmt"
	"slices"
	"sync"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/weftdb/weft/internal/assert"
	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/storenode/wal"
)

// Defaults of Options.
const (
	// DefaultTailBytes is the default Options.TailBytes: 4 MiB of entries held in memory.
	DefaultTailBytes = 4 << 20
	// DefaultMarkBytes is the default Options.MarkBytes: one index mark per MiB of entries.
	DefaultMarkBytes = 1 << 20
)

// Options configure a LogStore.
type Options struct {
	// FS and Dir are the file system and the directory of the log store's WAL (a directory
	// of its own).
	FS  vfs.FS
	Dir string
	// WAL configures the WAL (sync mode, segment size, record bound); After and
	// DurableThrough are set by Open.
	WAL wal.Options
	// SnapshotIndex, SnapshotTerm and ConfState are the latest snapshot (the engine's
	// checkpoint): what Snapshot and InitialState answer. A new log starts at the snapshot
	// index (its dummy entry); a log written before keeps its own compaction point.
	SnapshotIndex, SnapshotTerm uint64
	ConfState                   *raftpb.ConfState
	// TailBytes bounds the entries held in memory (the newest ones); older entries are read
	// back from the WAL. 0 means DefaultTailBytes.
	TailBytes int
	// MarkBytes is the spacing, in record bytes, of the index marks ((index, LSN) pairs from
	// which a read of old entries scans the WAL): it bounds what such a read scans before the
	// entry it wants. 0 means DefaultMarkBytes.
	MarkBytes int
}

// LogStore is raft's Storage over a WAL: every entry is one WAL record (its envelope), plus
// the local records kindRaftState (HardState and compaction point) and kindRaftTruncate
// (a conflicting suffix voided). Its methods may be called from any goroutine; Append,
// Compact, ApplySnapshot and CreateSnapshot are serialised among themselves.
type LogStore struct {
	// Invariants (mu guards every field below it):
	//   - The log is the entries (dummy, last]; dummy is the compacted index (its term
	//     dummyTerm), the entry raft's MemoryStorage keeps at ents[0]; hs.compactedIndex and
	//     hs.compactTerm equal them.
	//   - runs cover (dummy, last] in index order: runs[0].index <= dummy+1, each run's term
	//     holds up to the next run's index.
	//   - tail holds the entries tailFirst..last, at most opts.TailBytes of them (tailBytes):
	//     tailFirst > dummy; an empty tail has tailFirst = last+1.
	//   - marks are ascending in index and LSN; each names the live record of its index (LSN,
	//     and its segment and offset once known); marks[0].index <= dummy+1 when the log is
	//     not empty.
	//   - truncs are the truncation records at or after marks[0].pos.LSN, in LSN order: a
	//     record at LSN L with index x is live iff every trunc after L has index >= x.
	//   - Every record up to throughLSN is written, and the fields say what the WAL holds;
	//     stateLSN is the latest kindRaftState record's LSN, which no drop removes.
	//   - gen changes whenever entries become void or compacted (a read in flight then redoes).
	opts Options
	w    *wal.WAL

	writeMu sync.Mutex // serialises the writers (Append, Compact, ApplySnapshot, CreateSnapshot)

	mu                  sync.Mutex
	hs                  logState // term, vote, commit, and the compaction point
	dummy, dummyTerm    uint64
	last                uint64
	runs                []termRun
	tail                []*raftpb.Entry
	tailFirst           uint64
	tailBytes           int
	marks               []mark
	markBytes           int // record bytes appended since the last mark
	truncs              []truncPoint
	throughLSN          uint64
	stateLSN            uint64
	gen                 uint64
	snapIndex, snapTerm uint64
	confState           *raftpb.ConfState
	err                 error // sticky: the WAL failed (fail-stop), or ErrClosed
}

type termRun struct{ index, term uint64 }

// mark names the record of an entry: its LSN, and its segment and offset once known (from
// recovery, or from the first read that passed it), so a read starting there skips the
// records before it in its segment.
type mark struct {
	index uint64
	pos   wal.ReadFrom
}

type truncPoint struct{ lsn, index uint64 }

var _ raft.Storage = (*LogStore)(nil)

// Open opens (creating) the log store in opts.Dir and rebuilds its state from the WAL, with
// the WAL's torn-tail and corruption rules (wal.Open); a log whose entries do not follow one
// another, or that is missing entries after its compaction point, fails with an error
// wrapping corrupt.ErrCorruption.
func Open(opts Options) (*LogStore, error) {
	if opts.TailBytes == 0 {
		opts.TailBytes = DefaultTailBytes
	}
	if opts.MarkBytes == 0 {
		opts.MarkBytes = DefaultMarkBytes
	}
	if opts.TailBytes < 0 || opts.MarkBytes < 0 {
		return nil, fmt.Errorf("repl: open %s: TailBytes %d, MarkBytes %d", opts.Dir, opts.TailBytes, opts.MarkBytes)
	}
	// Segments dropped behind a compaction are gone: recovery starts at the oldest left.
	firsts, err := wal.SegmentFirsts(opts.FS, opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("repl: open %s: %w", opts.Dir, err)
	}
	wopts := opts.WAL
	wopts.After, wopts.DurableThrough = 0, 0
	if len(firsts) > 0 {
		wopts.After = firsts[0] - 1
	}
	s := &LogStore{opts: opts, snapIndex: opts.SnapshotIndex, snapTerm: opts.SnapshotTerm}
	s.confState = raftpb.EnsureConfState(cloneConfState(opts.ConfState))
	var r replayer
	r.s = s
	w, err := wal.Open(opts.FS, opts.Dir, wopts, r.record)
	if err != nil {
		return nil, fmt.Errorf("repl: open %s: %w", opts.Dir, err)
	}
	s.w = w
	s.throughLSN = w.LastLSN()
	if err := r.finish(); err != nil {
		_ = w.Close()
		return nil, fmt.Errorf("repl: open %s: %w", opts.Dir, err)
	}
	if !r.sawState {
		// A new log starts at the snapshot: its compaction point is recorded once, so that
		// later opens do not depend on the snapshot they are given.
		if err := s.writeState(s.hs, true); err != nil {
			_ = w.Close()
			return nil, fmt.Errorf("repl: open %s: %w", opts.Dir, err)
		}
	}
	return s, nil
}

// Close closes the WAL (syncing what was written). Every later call fails with ErrClosed.
func (s *LogStore) Close() error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.mu.Lock()
	if s.err == ErrClosed {
		s.mu.Unlock()
		return nil
	}
	s.err = ErrClosed
	s.mu.Unlock()
	return s.w.Close()
}

// InitialState returns the last HardState written and the ConfState given at Open.
func (s *LogStore) InitialState() (*raftpb.HardState, *raftpb.ConfState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	term, vote, commit := s.hs.term, s.hs.vote, s.hs.commit
	return &raftpb.HardState{Term: &term, Vote: &vote, Commit: &commit}, cloneConfState(s.confState), nil
}

// FirstIndex returns the index of the first entry that may be read: the compaction point + 1.
func (s *LogStore) FirstIndex() (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dummy + 1, nil
}

// LastIndex returns the index of the last entry (the compaction point for an empty log).
func (s *LogStore) LastIndex() (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last, nil
}

// Term returns the term of entry i: raft.ErrCompacted below the compaction point,
// raft.ErrUnavailable above the last index.
func (s *LogStore) Term(i uint64) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.termLocked(i)
}

func (s *LogStore) termLocked(i uint64) (uint64, error) {
	switch {
	case i < s.dummy:
		return 0, raft.ErrCompacted
	case i == s.dummy:
		return s.dummyTerm, nil
	case i > s.last:
		return 0, raft.ErrUnavailable
	}
	return termOf(s.runs, i), nil
}

// termOf returns the term of index i in runs (i covered by them).
func termOf(runs []termRun, i uint64) uint64 {
	lo, hi := 0, len(runs)
	for hi-lo > 1 {
		m := (lo + hi) / 2
		if runs[m].index <= i {
			lo = m
		} else {
			hi = m
		}
	}
	assert.That(len(runs) > 0 && runs[lo].index <= i, "repl: no term run covers an index in the log")
	return runs[lo].term
}

// Snapshot returns the latest snapshot's metadata (index, term, ConfState); its Data is
// empty (the snapshot's bytes are the engine's checkpoint, streamed apart).
func (s *LogStore) Snapshot() (*raftpb.Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	idx, term := s.snapIndex, s.snapTerm
	return &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{
		Index: &idx, Term: &term, ConfState: cloneConfState(s.confState),
	}}, nil
}

func cloneConfState(cs *raftpb.ConfState) *raftpb.ConfState {
	if cs == nil {
		return nil
	}
	return proto.Clone(cs).(*raftpb.ConfState)
}

// Entries returns the entries [lo, hi), at most maxSize bytes of them (proto size) but at
// least one: raft.ErrCompacted when lo is at or below the compaction point,
// raft.ErrUnavailable when the log is empty. Entries still in the in-memory tail come from
// it; older ones are read back from the WAL. The entries must not be modified.
func (s *LogStore) Entries(lo, hi, maxSize uint64) ([]*raftpb.Entry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		switch {
		case s.err == ErrClosed:
			return nil, ErrClosed
		case lo <= s.dummy:
			return nil, raft.ErrCompacted
		case hi > s.last+1:
			return nil, fmt.Errorf("%w: entries [%d, %d) past the last index %d", ErrBadAppend, lo, hi, s.last)
		case s.last == s.dummy:
			return nil, raft.ErrUnavailable
		case lo >= hi:
			return []*raftpb.Entry{}, nil
		}
		out, again, err := s.entriesLocked(lo, hi, maxSize)
		if !again {
			return out, err
		}
		// Entries became void or were compacted during a read: answer again.
	}
}

// entriesLocked collects the entries [lo, hi) (in the log) within maxSize: from the WAL
// up to the tail, with mu released while it reads, then from the tail. again says that the
// log changed under a read (gen), so the answer is void.
func (s *LogStore) entriesLocked(lo, hi, maxSize uint64) (out []*raftpb.Entry, again bool, err error) {
	lim := sizeLimit{max: maxSize}
	gen := s.gen
	for next := lo; ; {
		if next >= s.tailFirst {
			// The tail still holds [next, hi): appends only add to it, and whatever
			// removes entries changes gen.
			return s.tailRangeLocked(next, hi, &lim, out), false, nil
		}
		rd := s.readPlanLocked(next, min(hi, s.tailFirst))
		s.mu.Unlock()
		got, err := s.readEntries(rd, &lim)
		s.mu.Lock()
		if s.gen != gen {
			return nil, true, nil
		}
		if err != nil {
			return nil, false, err
		}
		out = append(out, got...)
		if next = rd.hi; lim.full || next >= hi {
			return out, false, nil
		}
	}
}

// sizeLimit is raft's limitSize rule: entries are taken while their total proto size stays
// within max, and the first one always.
type sizeLimit struct {
	max, size uint64
	n         int
	full      bool
}

func (l *sizeLimit) take(e *raftpb.Entry) bool {
	if l.full {
		return false
	}
	sz := uint64(proto.Size(e))
	if l.n > 0 && l.size+sz > l.max {
		l.full = true
		return false
	}
	l.size += sz
	l.n++
	return true
}

// tailRangeLocked appends the tail's entries [lo, hi) to out within lim.
func (s *LogStore) tailRangeLocked(lo, hi uint64, lim *sizeLimit, out []*raftpb.Entry) []*raftpb.Entry {
	for i := lo; i < hi; i++ {
		e := s.tail[i-s.tailFirst]
		if !lim.take(e) {
			break
		}
		out = append(out, e)
	}
	return out
}

// readPlan is what a read of old entries needs, taken under mu.
type readPlan struct {
	lo, hi    uint64       // the entries [lo, hi)
	from      wal.ReadFrom // the mark to scan from
	through   uint64
	truncs    []truncPoint
	truncMins []uint64 // truncMins[k]: the lowest index of truncs[k:]
	gen       uint64
}

func (s *LogStore) readPlanLocked(lo, hi uint64) readPlan {
	k := 0
	for k+1 < len(s.marks) && s.marks[k+1].index <= lo {
		k++
	}
	assert.That(len(s.marks) > 0 && s.marks[k].index <= lo, "repl: no index mark at or below an entry in the log")
	rd := readPlan{lo: lo, hi: hi, from: s.marks[k].pos, through: s.throughLSN, gen: s.gen}
	for _, t := range s.truncs {
		if t.lsn > rd.from.LSN {
			rd.truncs = append(rd.truncs, t)
		}
	}
	rd.truncMins = make([]uint64, len(rd.truncs))
	for k := len(rd.truncs) - 1; k >= 0; k-- {
		rd.truncMins[k] = rd.truncs[k].index
		if k+1 < len(rd.truncs) {
			rd.truncMins[k] = min(rd.truncMins[k], rd.truncMins[k+1])
		}
	}
	return rd
}

// readEntries reads the live entries [rd.lo, rd.hi) back from the WAL, within lim.
func (s *LogStore) readEntries(rd readPlan, lim *sizeLimit) ([]*raftpb.Entry, error) {
	var out []*raftpb.Entry
	want := rd.lo
	j := 0
	var at wal.ReadFrom // the mark's position, learnt
	err := s.w.ReadRecords(rd.from, rd.through, func(r wal.Record) (bool, error) {
		if r.LSN == rd.from.LSN {
			at = wal.ReadFrom{LSN: r.LSN, Segment: r.Segment, Offset: r.Offset}
		}
		for j < len(rd.truncs) && rd.truncs[j].lsn <= r.LSN {
			j++
		}
		if r.Kind == kindRaftState || r.Kind == kindRaftTruncate {
			return true, nil
		}
		h, err := decodeEnvelopeHeader(r.Kind, r.Payload)
		if err != nil {
			return false, fmt.Errorf("repl: read LSN %d: %w", r.LSN, err)
		}
		if h.index != want || (j < len(rd.truncs) && rd.truncMins[j] < h.index) {
			return true, nil // another entry, or one voided by a later truncation
		}
		e, err := decodeEntry(r.Kind, r.Payload)
		if err != nil {
			return false, fmt.Errorf("repl: read LSN %d: %w", r.LSN, err)
		}
		if !lim.take(e) {
			return false, nil
		}
		out = append(out, e)
		want++
		return want < rd.hi, nil
	})
	if err != nil {
		return nil, fmt.Errorf("repl: read entries [%d, %d): %w", rd.lo, rd.hi, err)
	}
	if want < rd.hi && !lim.full {
		return nil, corrupt.Errorf("repl: entry %d not found in the log (LSNs %d..%d)", want, rd.from.LSN, rd.through)
	}
	if rd.from.Segment == 0 && at.Segment != 0 {
		s.learnMark(at)
	}
	return out, nil
}

// learnMark records the position of a mark's record, if the mark is still there.
func (s *LogStore) learnMark(at wal.ReadFrom) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k, found := slices.BinarySearchFunc(s.marks, at.LSN, func(m mark, lsn uint64) int { return cmp.Compare(m.pos.LSN, lsn) })
	if found {
		s.marks[k].pos = at
	}
}
