package repl

import (
	"fmt"

	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/storenode/wal"
)

// Recovery of a log store: Open hands every record of the WAL (from the oldest segment left)
// to replayer.record, in LSN order, then calls finish.
//
// Rules:
//   - An entry record must follow the last live entry (index last+1); a kindRaftTruncate
//     record at t in [start, last] voids the entries above t; one past the last, below the
//     start, or whose term is not the term of entry t (ApplySnapshot) resets the log at t.
//   - The latest kindRaftState record gives the HardState and the compaction point; a log
//     without one (never written: Open writes one into a new log) starts at the snapshot
//     given.
//   - The entries must reach from the compaction point to the last one: a gap is corruption.

// replayer rebuilds a LogStore from its WAL's records.
type replayer struct {
	s        *LogStore
	started  bool // an entry or a reset has placed the log's start (s.dummy)
	sawState bool
	state    logState // the latest kindRaftState record
}

// record takes one WAL record; its payload is valid during the call only.
func (r *replayer) record(rec wal.Record) error {
	s := r.s
	switch rec.Kind {
	case kindRaftState:
		st, err := decodeState(rec.Payload)
		if err != nil {
			return fmt.Errorf("LSN %d: %w", rec.LSN, err)
		}
		r.state, r.sawState, s.stateLSN = st, true, rec.LSN
	case kindRaftTruncate:
		t, err := decodeTruncate(rec.Payload)
		if err != nil {
			return fmt.Errorf("LSN %d: %w", rec.LSN, err)
		}
		if !r.started || t.index < s.dummy || t.index > s.last || s.termAtLocked(t.index) != t.term {
			s.resetLocked(rec.LSN, t.index, t.term)
			r.started = true
			return nil
		}
		s.truncateLocked(rec.LSN, t)
	default:
		h, err := decodeEnvelopeHeader(rec.Kind, rec.Payload)
		if err != nil {
			return fmt.Errorf("LSN %d: %w", rec.LSN, err)
		}
		if !r.started {
			// The oldest segment left may start anywhere: the entries before it were
			// compacted (finish checks that the compaction point covers them).
			s.dummy, s.dummyTerm, s.last, s.tailFirst = h.index-1, 0, h.index-1, h.index
			r.started = true
		}
		if h.index != s.last+1 {
			return corrupt.Errorf("repl: LSN %d: entry %d follows entry %d", rec.LSN, h.index, s.last)
		}
		e, err := decodeEntry(rec.Kind, rec.Payload)
		if err != nil {
			return fmt.Errorf("LSN %d: %w", rec.LSN, err)
		}
		s.appendLocked(wal.ReadFrom{LSN: rec.LSN, Segment: rec.Segment, Offset: rec.Offset}, e, recordBytes(e))
	}
	return nil
}

// finish places the compaction point and checks the entries reach it.
func (r *replayer) finish() error {
	s := r.s
	c, cTerm := s.opts.SnapshotIndex, s.opts.SnapshotTerm
	if r.sawState {
		c, cTerm = r.state.compactedIndex, r.state.compactTerm
		s.hs.term, s.hs.vote, s.hs.commit = r.state.term, r.state.vote, r.state.commit
	}
	switch {
	case !r.started || c >= s.last:
		s.resetLocked(s.throughLSN+1, c, cTerm)
	case c < s.dummy:
		return corrupt.Errorf("repl: the log's entries start at %d, after its compaction point %d: entries %d..%d missing",
			s.dummy+1, c, c+1, s.dummy)
	case c > s.dummy:
		if t := termOf(s.runs, c); t != cTerm {
			return corrupt.Errorf("repl: entry %d has term %d, the compaction point says %d", c, t, cTerm)
		}
		s.compactLocked(c, cTerm)
	default:
		s.dummyTerm = cTerm
		s.hs.compactedIndex, s.hs.compactTerm = c, cTerm
	}
	if len(s.tail) == 0 {
		s.tailFirst = s.last + 1
	}
	return nil
}

// termAtLocked is the term of entry i in [dummy, last] as replay knows it (0 for a dummy
// whose term is not known yet).
func (s *LogStore) termAtLocked(i uint64) uint64 {
	if i == s.dummy {
		return s.dummyTerm
	}
	return termOf(s.runs, i)
}
