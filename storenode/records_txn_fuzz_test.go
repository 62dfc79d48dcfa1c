package storenode

import (
	"bytes"
	"errors"
	"testing"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/corrupt"
)

// FuzzDecodeTxnRecords covers the two-phase commit's WAL records (records_txn.go): every
// input decodes to what re-encodes to the same bytes, or fails with a corruption error. The
// first byte picks the decoder.
func FuzzDecodeTxnRecords(f *testing.F) {
	id := base.TxnID{1, 2, 3, 15: 16}
	for _, c := range commitSeeds() {
		f.Add(append(append([]byte{0}, appendTxnPrepareHeader(nil, id, 77, 3, "10.0.0.1:7000")...), c...))
		f.Add(append(append([]byte{0}, appendTxnPrepareHeader(nil, id, -1, 0, "")...), c...))
	}
	f.Add(append([]byte{1}, appendTxnDecideRecord(nil, id, base.DecisionCommit, 3, 77, 5)...))
	f.Add(append([]byte{1}, appendTxnDecideRecord(nil, id, base.DecisionAbort, 64, 77, ^uint64(0))...))
	f.Add(append([]byte{2}, appendTxnReportedRecord(nil, id, 63)...))
	f.Add(append([]byte{3}, appendTxnApplyRecord(nil, id, base.DecisionAbort, 2, "h:1")...))
	f.Add(append([]byte{3}, appendTxnApplyRecord(nil, id, base.DecisionCommit, 0, "")...))
	fuzzRecordKinds(f, 4, func(t *testing.T, kind byte, p []byte) (again []byte, err error) {
		switch kind {
		case 0:
			var rec txnPrepareRecord
			if err = decodeTxnPrepareRecord(p, &rec); err == nil {
				c := &rec.commit
				b := &base.Batch{Owner: c.owner, Seq: c.seq, Fences: c.fences, Segments: c.segments}
				i := 0
				again = appendTxnPrepareHeader(nil, rec.id, rec.lease, rec.index, rec.primary)
				again = appendCommitRecord(again, b, c.hash, func(uint32) int { i++; return c.rowBytes[i-1] })
				if !bytes.Equal(rec.body, again[len(again)-len(rec.body):]) {
					t.Fatalf("body does not alias the record's end")
				}
			}
		case 1:
			rid, d, count, lease, reported, derr := decodeTxnDecideRecord(p)
			if err = derr; err == nil {
				again = appendTxnDecideRecord(nil, rid, d, count, lease, reported)
			}
		case 2:
			rid, index, derr := decodeTxnReportedRecord(p)
			if err = derr; err == nil {
				again = appendTxnReportedRecord(nil, rid, index)
			}
		case 3:
			rid, d, index, primary, derr := decodeTxnApplyRecord(p)
			if err = derr; err == nil {
				again = appendTxnApplyRecord(nil, rid, d, index, primary)
			}
		}
		return again, err
	}, func(t *testing.T, again, p []byte) {
		if !bytes.Equal(again, p) {
			t.Fatalf("decoded record re-encodes differently:\n got %x\nwant %x", again, p)
		}
	})
}

// FuzzDecodeTxnForgotRecord covers the forgot record (records_txn.go): every input decodes to
// ids that re-encode to the same bytes, or fails with a corruption error, naming no id.
func FuzzDecodeTxnForgotRecord(f *testing.F) {
	f.Add(appendTxnForgotRecord(nil, []base.TxnID{{1, 2, 3, 15: 16}}))
	f.Add(appendTxnForgotRecord(nil, []base.TxnID{{1}, {2}, {15: 3}}))
	many := make([]base.TxnID, txnForgotIDsMax)
	for i := range many {
		many[i][0], many[i][15] = byte(i), byte(i>>8)
	}
	f.Add(appendTxnForgotRecord(nil, many))
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, p []byte) {
		var ids []base.TxnID
		err := decodeTxnForgotRecord(p, func(id base.TxnID) { ids = append(ids, id) })
		if err != nil {
			if !errors.Is(err, corrupt.ErrCorruption) {
				t.Fatalf("not a corruption error: %v", err)
			}
			if len(ids) != 0 {
				t.Fatalf("%d ids named by a record refused", len(ids))
			}
			return
		}
		if again := appendTxnForgotRecord(nil, ids); !bytes.Equal(again, p) {
			t.Fatalf("decoded record re-encodes differently:\n got %x\nwant %x", again, p)
		}
	})
}

// FuzzDecodeExpiredRecord covers the expiry record of a replicated store (records_repl.go):
// every input decodes to owners that re-encode to the same bytes, or fails with a corruption
// error, naming no owner.
func FuzzDecodeExpiredRecord(f *testing.F) {
	f.Add(appendExpiredRecord(nil, []expiredOwner{{owner: 7, seq: 3}}))
	f.Add(appendExpiredRecord(nil, []expiredOwner{{owner: 1, seq: 0}, {owner: 2, seq: 9}, {owner: ^uint64(0), seq: ^uint64(0)}}))
	many := make([]expiredOwner, expiredOwnersMax)
	for i := range many {
		many[i] = expiredOwner{owner: uint64(i) + 100, seq: uint64(i)}
	}
	f.Add(appendExpiredRecord(nil, many))
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 1, 7, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, p []byte) {
		var owners []expiredOwner
		err := decodeExpiredRecord(p, func(x expiredOwner) { owners = append(owners, x) })
		if err != nil {
			if !errors.Is(err, corrupt.ErrCorruption) {
				t.Fatalf("not a corruption error: %v", err)
			}
			if len(owners) != 0 {
				t.Fatalf("%d owners named by a record refused", len(owners))
			}
			return
		}
		if again := appendExpiredRecord(nil, owners); !bytes.Equal(again, p) {
			t.Fatalf("decoded record re-encodes differently:\n got %x\nwant %x", again, p)
		}
	})
}
