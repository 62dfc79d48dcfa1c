package storenode

import (
	"bytes"
	"errors"
	"testing"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/corrupt"
)

// txnStateSeeds are sidecars (txnstate.go) of every entry kind, for the fuzzer and the
// codec's table test: empty, each kind alone, and all of them in the file's order.
func txnStateSeeds() [][]byte {
	id := base.TxnID{1, 2, 3, 15: 16}
	other := base.TxnID{9, 15: 1}
	var prepares []txnStateEntry
	for _, c := range commitSeeds() {
		var cr commitRecord
		if decodeCommitRecord(c, &cr) != nil || cr.owner == 0 || cr.owner == MoveWriter || cr.seq == 0 {
			continue
		}
		rec := append(appendTxnPrepareHeader(nil, id, 77, 3, "10.0.0.1:7000"), c...)
		prepares = append(prepares, txnStateEntry{kind: kindTxnPrepare, lsn: 3, payload: rec})
	}
	apply := txnStateEntry{kind: kindTxnApply, lsn: 5, payload: appendTxnApplyRecord(nil, other, base.DecisionAbort, 2, "h:1")}
	decide := txnStateEntry{kind: kindTxnDecide, lsn: 7, payload: appendTxnDecideRecord(nil, id, base.DecisionCommit, 3, 77, 5)}
	forgot := txnStateEntry{kind: kindTxnDecide, lsn: 9, payload: appendTxnDecideRecord(nil, other, base.DecisionAbort, txnParticipantsMax, 0, ^uint64(0))}
	move := txnStateEntry{kind: kindMoveState, lsn: 9, payload: appendMoveStateRecord(nil, 4, MoveIncoming, 12)}
	gone := txnStateEntry{kind: txnStateForgotten, lsn: 9, payload: appendTxnDecideRecord(nil, base.TxnID{8}, base.DecisionCommit, txnParticipantsMax, 0, ^uint64(0))}
	gone2 := txnStateEntry{kind: txnStateForgotten, lsn: 9, payload: appendTxnDecideRecord(nil, base.TxnID{2}, base.DecisionAbort, txnParticipantsMax, 0, ^uint64(0))}
	sets := [][]txnStateEntry{nil, {apply}, {decide, forgot}, {move}, {gone, gone2}, {apply, decide, forgot, gone, gone2, move}}
	for _, p := range prepares {
		sets = append(sets, []txnStateEntry{p}, []txnStateEntry{p, apply, decide, move})
	}
	var out [][]byte
	for _, s := range sets {
		out = append(out, encodeTxnStateBytes(9, s))
	}
	return out
}

// encodeTxnStateBytes is encodeTxnState into one slice.
func encodeTxnStateBytes(index uint64, entries []txnStateEntry) []byte {
	var b []byte
	_ = encodeTxnState(index, entries, func(p []byte) error { b = append(b, p...); return nil })
	return b
}

// FuzzDecodeTxnState: every input decodes to entries that re-encode to the same bytes, or
// fails with a corruption error (a torn or damaged sidecar is never taken for a state).
func FuzzDecodeTxnState(f *testing.F) {
	for _, s := range txnStateSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		index, entries, err := decodeTxnState(in)
		if err != nil {
			if !errors.Is(err, corrupt.ErrCorruption) {
				t.Fatalf("not a corruption error: %v", err)
			}
			return
		}
		if again := encodeTxnStateBytes(index, entries); !bytes.Equal(again, in) {
			t.Fatalf("decoded sidecar re-encodes differently:\n got %x\nwant %x", again, in)
		}
	})
}

// TestTxnStateCodec: the seeds decode to what they encode; a cut anywhere, a flipped byte
// anywhere, entries out of order and an id twice are corruption.
func TestTxnStateCodec(t *testing.T) {
	for i, s := range txnStateSeeds() {
		index, entries, err := decodeTxnState(s)
		if err != nil {
			t.Fatalf("seed %d: %v", i, err)
		}
		if index != 9 || !bytes.Equal(encodeTxnStateBytes(index, entries), s) {
			t.Fatalf("seed %d does not round-trip", i)
		}
		for cut := range len(s) {
			if _, _, err := decodeTxnState(s[:cut]); !errors.Is(err, corrupt.ErrCorruption) {
				t.Fatalf("seed %d cut at %d: %v", i, cut, err)
			}
		}
		for at := range len(s) {
			b := bytes.Clone(s)
			b[at] ^= 0x01
			if _, _, err := decodeTxnState(b); !errors.Is(err, corrupt.ErrCorruption) {
				t.Fatalf("seed %d flipped at %d: %v", i, at, err)
			}
		}
	}
	id := base.TxnID{7}
	decide := txnStateEntry{kind: kindTxnDecide, lsn: 1, payload: appendTxnDecideRecord(nil, id, base.DecisionCommit, 1, 0, 0)}
	apply := txnStateEntry{kind: kindTxnApply, lsn: 1, payload: appendTxnApplyRecord(nil, id, base.DecisionCommit, 0, "")}
	move := txnStateEntry{kind: kindMoveState, lsn: 1, payload: appendMoveStateRecord(nil, 3, MoveFrozen, 1)}
	live := txnStateEntry{kind: kindMoveState, lsn: 1, payload: appendMoveStateRecord(nil, 3, MoveLive, 0)}
	late := txnStateEntry{kind: kindTxnApply, lsn: 10, payload: apply.payload}
	for name, ents := range map[string][]txnStateEntry{
		"decision before part":   {decide, apply},
		"move before decision":   {move, decide},
		"part twice":             {apply, apply},
		"decision twice":         {decide, decide},
		"move twice":             {move, move},
		"live move":              {live},
		"forgotten with a lease": {{kind: txnStateForgotten, lsn: 1, payload: appendTxnDecideRecord(nil, id, base.DecisionCommit, txnParticipantsMax, 5, ^uint64(0))}},
		"forgotten twice": {{kind: txnStateForgotten, lsn: 1, payload: appendTxnDecideRecord(nil, id, base.DecisionCommit, txnParticipantsMax, 0, ^uint64(0))},
			{kind: txnStateForgotten, lsn: 1, payload: appendTxnDecideRecord(nil, id, base.DecisionAbort, txnParticipantsMax, 0, ^uint64(0))}},
		"move before forgotten": {move, {kind: txnStateForgotten, lsn: 1, payload: appendTxnDecideRecord(nil, id, base.DecisionCommit, txnParticipantsMax, 0, ^uint64(0))}},
		"LSN past the index":    {late},
	} {
		if _, _, err := decodeTxnState(encodeTxnStateBytes(9, ents)); !errors.Is(err, corrupt.ErrCorruption) {
			t.Fatalf("%s: %v", name, err)
		}
	}
}
