package repl

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/weftdb/weft/internal/assert"
	"github.com/weftdb/weft/storenode/wal"
)

// The writers of the log store: each builds its records under mu, writes them as one WAL
// group with writeMu held (so the state cannot change meanwhile but through it), then
// applies them to the in-memory state under mu. A failed write is sticky: the WAL is
// fail-stop, and so is the log store.

// Append writes the entries (consecutive indexes; those at or below the compaction point are
// skipped, as raft.MemoryStorage.Append does) and, if hs is not nil and differs from the last
// one, the HardState, as one WAL group, and returns once it is written: synced with
// wal.SyncAlways, and in every sync mode when force is set or the HardState's term or vote
// changed (a vote is never forgotten); a forced Append with nothing to write syncs what was
// written before. Entries above the index before the first one are void
// first (a kindRaftTruncate record): a follower's conflicting suffix. The entries are not
// kept: Append copies what it needs.
func (s *LogStore) Append(ents []*raftpb.Entry, hs *raftpb.HardState, force bool) error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.mu.Lock()
	if s.err != nil {
		err := s.err
		s.mu.Unlock()
		return err
	}
	if len(ents) > 0 && ents[len(ents)-1].GetIndex() <= s.dummy {
		ents = nil
	} else if len(ents) > 0 && ents[0].GetIndex() <= s.dummy {
		ents = ents[s.dummy+1-ents[0].GetIndex():]
	}
	var trunc *truncation
	if len(ents) > 0 {
		first := ents[0].GetIndex()
		if first > s.last+1 {
			last := s.last
			s.mu.Unlock()
			return fmt.Errorf("%w: entry %d appended after the last index %d", ErrBadAppend, first, last)
		}
		if first <= s.last {
			term, err := s.termLocked(first - 1)
			assert.That(err == nil, "repl: no term for the entry before an append")
			trunc = &truncation{index: first - 1, term: term}
		}
	}
	st, changed, termVote := s.hs, false, false
	if hs != nil && (hs.GetTerm() != s.hs.term || hs.GetVote() != s.hs.vote || hs.GetCommit() != s.hs.commit) {
		termVote = hs.GetTerm() != s.hs.term || hs.GetVote() != s.hs.vote
		st.term, st.vote, st.commit, changed = hs.GetTerm(), hs.GetVote(), hs.GetCommit(), true
	}
	s.mu.Unlock()

	recs := make([]wal.BatchRecord, 0, len(ents)+2)
	if trunc != nil {
		b := encodeTruncate(*trunc)
		recs = append(recs, wal.BatchRecord{Kind: kindRaftTruncate, Payload: [][]byte{b[:]}})
	}
	for k, e := range ents {
		if k > 0 && e.GetIndex() != ents[k-1].GetIndex()+1 {
			return fmt.Errorf("%w: entry %d follows entry %d", ErrBadAppend, e.GetIndex(), ents[k-1].GetIndex())
		}
		r, err := encodeEntry(e)
		if err != nil {
			return err
		}
		recs = append(recs, wal.BatchRecord{Kind: r.kind, Payload: [][]byte{r.header[:], r.payload}})
	}
	if changed {
		b := encodeState(st)
		recs = append(recs, wal.BatchRecord{Kind: kindRaftState, Payload: [][]byte{b[:]}})
	}
	if len(recs) == 0 {
		if !force {
			return nil
		}
		// Nothing to write, but force promises that what was appended is durable.
		if err := s.w.Sync(); err != nil {
			return s.fail(fmt.Errorf("repl: append: %w", err))
		}
		return nil
	}
	lsn, err := s.w.AppendBatch(context.Background(), recs, force || termVote)
	if errors.Is(err, wal.ErrTooLarge) {
		return fmt.Errorf("repl: append: %w", err) // nothing was queued: not a failure of the log
	}
	if err != nil {
		return s.fail(fmt.Errorf("repl: append: %w", err))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if trunc != nil {
		s.truncateLocked(lsn, *trunc)
		lsn++
	}
	for _, e := range ents {
		s.appendLocked(wal.ReadFrom{LSN: lsn}, e, recordBytes(e))
		lsn++
	}
	if changed {
		s.hs.term, s.hs.vote, s.hs.commit = st.term, st.vote, st.commit
		s.stateLSN = lsn
		lsn++
	}
	s.throughLSN = lsn - 1
	return nil
}

// recordBytes approximates an entry's WAL record size (header, envelope, payload).
func recordBytes(e *raftpb.Entry) int { return 32 + envelopeBytes + len(e.GetData()) }

// fail makes err the sticky error and returns it.
func (s *LogStore) fail(err error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
	}
	return s.err
}

// Compact discards the entries up to index i (raft.MemoryStorage.Compact): i becomes the
// compaction point (a kindRaftState record, synced), and the WAL segments holding only
// records before the entries kept (and before the latest state record) are dropped.
// raft.ErrCompacted when i is at or below the compaction point; an error wrapping
// ErrBadAppend past the last index.
func (s *LogStore) Compact(i uint64) error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.mu.Lock()
	if s.err != nil {
		err := s.err
		s.mu.Unlock()
		return err
	}
	if i <= s.dummy {
		s.mu.Unlock()
		return raft.ErrCompacted
	}
	if i > s.last {
		last := s.last
		s.mu.Unlock()
		return fmt.Errorf("%w: compact %d past the last index %d", ErrBadAppend, i, last)
	}
	term, _ := s.termLocked(i)
	st := s.hs
	st.compactedIndex, st.compactTerm = i, term
	s.mu.Unlock()
	if err := s.writeState(st, true); err != nil {
		return err
	}
	s.mu.Lock()
	s.compactLocked(i, term)
	cut := s.stateLSN
	if len(s.marks) > 0 {
		cut = min(cut, s.marks[0].pos.LSN)
	}
	s.mu.Unlock()
	if err := s.w.DropBefore(cut); err != nil {
		return s.fail(fmt.Errorf("repl: compact %d: %w", i, err))
	}
	return nil
}

// writeState writes st as a kindRaftState record (synced when force) and makes it the
// log store's state. Called with writeMu held.
func (s *LogStore) writeState(st logState, force bool) error {
	b := encodeState(st)
	lsn, err := s.w.AppendBatch(context.Background(), []wal.BatchRecord{{Kind: kindRaftState, Payload: [][]byte{b[:]}}}, force)
	if err != nil {
		return s.fail(fmt.Errorf("repl: write state: %w", err))
	}
	s.mu.Lock()
	s.hs.term, s.hs.vote, s.hs.commit = st.term, st.vote, st.commit
	s.stateLSN, s.throughLSN = lsn, lsn
	s.mu.Unlock()
	return nil
}

// ApplySnapshot resets the log to the snapshot (raft.MemoryStorage.ApplySnapshot): every
// entry is discarded and the log continues after the snapshot's index. raft.ErrSnapOutOfDate
// when it is not newer than the snapshot held. The records (the compaction point, then the
// truncation) are synced; the older segments are dropped.
func (s *LogStore) ApplySnapshot(snap *raftpb.Snapshot) error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	md := snap.GetMetadata()
	idx, term := md.GetIndex(), md.GetTerm()
	s.mu.Lock()
	if s.err != nil {
		err := s.err
		s.mu.Unlock()
		return err
	}
	if s.snapIndex != 0 && s.snapIndex >= idx {
		s.mu.Unlock()
		return raft.ErrSnapOutOfDate
	}
	st := s.hs
	st.compactedIndex, st.compactTerm = idx, term
	s.mu.Unlock()
	// The state record first: a crash that keeps only it leaves the compaction point at the
	// snapshot, never a truncation without it.
	sb, tb := encodeState(st), encodeTruncate(truncation{index: idx, term: term})
	lsn, err := s.w.AppendBatch(context.Background(), []wal.BatchRecord{
		{Kind: kindRaftState, Payload: [][]byte{sb[:]}},
		{Kind: kindRaftTruncate, Payload: [][]byte{tb[:]}},
	}, true)
	if err != nil {
		return s.fail(fmt.Errorf("repl: apply snapshot %d: %w", idx, err))
	}
	s.mu.Lock()
	s.resetLocked(lsn+1, idx, term)
	s.stateLSN, s.throughLSN = lsn, lsn+1
	s.snapIndex, s.snapTerm = idx, term
	s.confState = raftpb.EnsureConfState(cloneConfState(md.GetConfState()))
	s.mu.Unlock()
	if err := s.w.DropBefore(lsn); err != nil {
		return s.fail(fmt.Errorf("repl: apply snapshot %d: %w", idx, err))
	}
	return nil
}

// CreateSnapshot records a snapshot at index i (raft.MemoryStorage.CreateSnapshot): Snapshot
// answers it from now on; with a nil cs the ConfState stays. The log is not changed, and the
// snapshot is not written: the engine's checkpoint is the snapshot, and its meta gives it to
// the next Open. raft.ErrSnapOutOfDate when i is not above the snapshot held.
func (s *LogStore) CreateSnapshot(i uint64, cs *raftpb.ConfState) error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if i <= s.snapIndex {
		return raft.ErrSnapOutOfDate
	}
	if i > s.last {
		return fmt.Errorf("%w: snapshot %d past the last index %d", ErrBadAppend, i, s.last)
	}
	term, err := s.termLocked(i)
	if err != nil {
		return err
	}
	s.snapIndex, s.snapTerm = i, term
	if cs != nil {
		s.confState = cloneConfState(cs)
	}
	return nil
}

// appendLocked adds the entry written at pos (record of about size bytes) after the last.
func (s *LogStore) appendLocked(pos wal.ReadFrom, e *raftpb.Entry, size int) {
	x := e.GetIndex()
	if x != s.last+1 {
		assert.Failf("repl: entry %d appended after %d", x, s.last)
	}
	if len(s.runs) == 0 || s.runs[len(s.runs)-1].term != e.GetTerm() {
		s.runs = append(s.runs, termRun{index: x, term: e.GetTerm()})
	}
	if len(s.marks) == 0 || s.markBytes >= s.opts.MarkBytes {
		s.marks = append(s.marks, mark{index: x, pos: pos})
		s.markBytes = 0
	}
	s.markBytes += size
	if len(s.tail) == 0 {
		s.tailFirst = x
	}
	s.tail = append(s.tail, e)
	s.tailBytes += size
	for len(s.tail) > 0 && s.tailBytes > s.opts.TailBytes {
		s.tailBytes -= recordBytes(s.tail[0])
		s.tail[0] = nil
		s.tail = s.tail[1:]
		s.tailFirst++
	}
	s.last = x
}

// truncateLocked voids the entries above t.index (the record at lsn); t.index is in
// [dummy, last].
func (s *LogStore) truncateLocked(lsn uint64, t truncation) {
	if t.index < s.dummy || t.index > s.last {
		assert.Failf("repl: truncation at %d outside [%d, %d]", t.index, s.dummy, s.last)
	}
	if t.index == s.last {
		return
	}
	s.cutAboveLocked(t.index)
	s.truncs = append(s.truncs, truncPoint{lsn: lsn, index: t.index})
}

// cutAboveLocked drops the in-memory state of the entries above i.
func (s *LogStore) cutAboveLocked(i uint64) {
	for len(s.runs) > 0 && s.runs[len(s.runs)-1].index > i {
		s.runs = s.runs[:len(s.runs)-1]
	}
	for len(s.marks) > 0 && s.marks[len(s.marks)-1].index > i {
		s.marks = s.marks[:len(s.marks)-1]
	}
	s.markBytes = s.opts.MarkBytes // the next entry gets a mark
	if i < s.tailFirst {
		clear(s.tail)
		s.tail, s.tailBytes, s.tailFirst = s.tail[:0], 0, i+1
	} else if n := int(i + 1 - s.tailFirst); n < len(s.tail) {
		for _, e := range s.tail[n:] {
			s.tailBytes -= recordBytes(e)
		}
		clear(s.tail[n:])
		s.tail = s.tail[:n]
	}
	s.last = i
	s.gen++
}

// compactLocked makes i (term) the compaction point; i is in (dummy, last].
func (s *LogStore) compactLocked(i, term uint64) {
	s.dummy, s.dummyTerm = i, term
	s.hs.compactedIndex, s.hs.compactTerm = i, term
	for len(s.runs) > 1 && s.runs[1].index <= i+1 {
		s.runs = s.runs[1:]
	}
	for len(s.marks) > 1 && s.marks[1].index <= i+1 {
		s.marks = s.marks[1:]
	}
	s.dropTruncsLocked()
	for len(s.tail) > 0 && s.tailFirst <= i {
		s.tailBytes -= recordBytes(s.tail[0])
		s.tail[0] = nil
		s.tail = s.tail[1:]
		s.tailFirst++
	}
	if len(s.tail) == 0 {
		s.tailFirst = max(s.tailFirst, i+1)
	}
	s.gen++
}

// dropTruncsLocked forgets the truncations no read can meet (before the first mark).
func (s *LogStore) dropTruncsLocked() {
	k := 0
	for k < len(s.truncs) && (len(s.marks) == 0 || s.truncs[k].lsn < s.marks[0].pos.LSN) {
		k++
	}
	s.truncs = s.truncs[k:]
}

// resetLocked empties the log at index i (term): everything written before lsn is void.
func (s *LogStore) resetLocked(lsn, i, term uint64) {
	clear(s.tail)
	s.tail, s.tailBytes, s.tailFirst = s.tail[:0], 0, i+1
	s.runs, s.marks, s.truncs = s.runs[:0], s.marks[:0], s.truncs[:0]
	s.markBytes = 0
	s.dummy, s.dummyTerm, s.last = i, term, i
	s.hs.compactedIndex, s.hs.compactTerm = i, term
	s.gen++
	_ = lsn
}
