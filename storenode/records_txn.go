package storenode

import (
	"encoding/binary"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/corrupt"
)

// WAL records of the two-phase commit (txn.go). All integers little-endian; every record
// but kindTxnForgot starts with the transaction's 16-byte id. Part of the format; do not
// change.
//
//	kindTxnPrepare   txn [16] | lease i64 | index u16 | primary length u16 | reserved u32
//	                 | primary (host:port, zero-padded to a multiple of 8)
//	                 | batch hash u64 | the batch's sgio Commit body, byte for byte (as kindCommit)
//	kindTxnDecide    txn [16] | decision u8 | reserved u8 | count u16 | reserved u32
//	                 | lease i64 | reported u64 (bit i: participant i applied the decision)
//	kindTxnReported  txn [16] | index u16 | reserved [6]
//	kindTxnApply     txn [16] | decision u8 | reserved u8 | index u16 | primary length u16
//	                 | reserved u16 | primary (zero-padded to a multiple of 8)
//	kindTxnForgot    count u16 | reserved [6] | txn [16] x count (1..256)
//
// A prepare record is a participant's promise: its batch, the primary to ask and its index
// among the transaction's participants. A decide record is the decision at the primary
// (written first by Decide or by a resolver's abort, and again, with the reports so far, by
// each checkpoint that carries it). A reported record is one participant's report that it
// applied the decision. An apply record is a participant applying the decision: with the
// prepared batch still in the replayed state it applies (commit) or drops (abort) it; alone
// (carried by a checkpoint after the batch was applied) it means "applied, not yet reported".
// A forgot record lists the applied parts one resolver pass forgot, the primary having
// acknowledged their reports: replay drops them (without it, every part applied since the
// last checkpoint came back as "applied, not yet reported"). It is not forced: lost in a
// crash, the parts come back and are reported again, which is harmless.
//
// The batch hash is the dedup window's hash of the prepare (txnBatchHash: the batch hash
// mixed with the transaction id), so a Commit under the prepare's seq is never taken for it.
// The primary is empty when this node is the primary. The body starts 8-aligned in the
// payload, so rows aliasing a payload stay 8-aligned.
const (
	kindTxnPrepare  byte = 8
	kindTxnDecide   byte = 9
	kindTxnReported byte = 10
	kindTxnApply    byte = 11
	kindTxnForgot   byte = 12

	txnIDBytes          = 16
	txnPrepareFixed     = 32
	txnDecideBytes      = 40
	txnReportedBytes    = 24
	txnApplyFixed       = 24
	txnForgotFixed      = 8
	txnForgotIDsMax     = txnTasksMax
	txnPrimaryBytesMax  = 255
	txnParticipantsMax  = 64
	txnPrimaryPadFactor = 8
)

func padTo8(n int) int { return (n + txnPrimaryPadFactor - 1) &^ (txnPrimaryPadFactor - 1) }

func appendPadded(dst []byte, s string) []byte {
	dst = append(dst, s...)
	for i := len(s); i < padTo8(len(s)); i++ {
		dst = append(dst, 0)
	}
	return dst
}

// appendTxnPrepareHeader appends a prepare record's fields before the batch hash.
func appendTxnPrepareHeader(dst []byte, id base.TxnID, lease int64, index uint16, primary string) []byte {
	dst = append(dst, id[:]...)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(lease))
	dst = binary.LittleEndian.AppendUint16(dst, index)
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(primary)))
	dst = binary.LittleEndian.AppendUint32(dst, 0)
	return appendPadded(dst, primary)
}

// txnPrepareRecord is a decoded kindTxnPrepare payload; commit aliases the payload.
type txnPrepareRecord struct {
	id      base.TxnID
	lease   int64
	index   uint16
	primary string
	commit  commitRecord
	body    []byte // the Commit body, aliasing the payload
}

// decodeTxnPrepareRecord decodes a kindTxnPrepare payload; every error wraps
// corrupt.ErrCorruption.
func decodeTxnPrepareRecord(p []byte, rec *txnPrepareRecord) error {
	if len(p) < txnPrepareFixed {
		return corrupt.Errorf("storenode: prepare record of %d bytes", len(p))
	}
	copy(rec.id[:], p)
	rec.lease = int64(binary.LittleEndian.Uint64(p[16:]))
	rec.index = binary.LittleEndian.Uint16(p[24:])
	n := int(binary.LittleEndian.Uint16(p[26:]))
	if binary.LittleEndian.Uint32(p[28:]) != 0 {
		return corrupt.Errorf("storenode: prepare record: reserved bytes not zero")
	}
	if rec.index >= txnParticipantsMax || n > txnPrimaryBytesMax {
		return corrupt.Errorf("storenode: prepare record: participant %d, primary of %d bytes", rec.index, n)
	}
	at := txnPrepareFixed + padTo8(n)
	if len(p) < at {
		return corrupt.Errorf("storenode: prepare record: primary of %d bytes in %d", n, len(p))
	}
	for _, c := range p[txnPrepareFixed+n : at] {
		if c != 0 {
			return corrupt.Errorf("storenode: prepare record: padding not zero")
		}
	}
	rec.primary = string(p[txnPrepareFixed : txnPrepareFixed+n])
	if err := decodeCommitRecord(p[at:], &rec.commit); err != nil {
		return err
	}
	rec.body = p[at+commitHashBytes:]
	return nil
}

func appendTxnDecideRecord(dst []byte, id base.TxnID, d base.Decision, count uint16, lease int64, reported uint64) []byte {
	dst = append(dst, id[:]...)
	dst = append(dst, byte(d), 0)
	dst = binary.LittleEndian.AppendUint16(dst, count)
	dst = binary.LittleEndian.AppendUint32(dst, 0)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(lease))
	return binary.LittleEndian.AppendUint64(dst, reported)
}

func decodeTxnDecideRecord(p []byte) (id base.TxnID, d base.Decision, count uint16, lease int64, reported uint64, err error) {
	if len(p) != txnDecideBytes {
		return id, 0, 0, 0, 0, corrupt.Errorf("storenode: decide record of %d bytes", len(p))
	}
	copy(id[:], p)
	d, count = base.Decision(p[16]), binary.LittleEndian.Uint16(p[18:])
	lease, reported = int64(binary.LittleEndian.Uint64(p[24:])), binary.LittleEndian.Uint64(p[32:])
	switch {
	case d != base.DecisionCommit && d != base.DecisionAbort:
		return id, 0, 0, 0, 0, corrupt.Errorf("storenode: decide record: decision %d", d)
	case p[17] != 0 || binary.LittleEndian.Uint32(p[20:]) != 0:
		return id, 0, 0, 0, 0, corrupt.Errorf("storenode: decide record: reserved bytes not zero")
	case count > txnParticipantsMax || d == base.DecisionCommit && count < txnParticipantsMax && reported>>count != 0:
		// An abort's reports beyond its count are no damage: count 0 is "participants
		// unknown" (a resolver's abort), and the engine of b3f6c9d took any report of one and
		// kept it when it learned the count (decisionMask: only counted bits matter).
		return id, 0, 0, 0, 0, corrupt.Errorf("storenode: decide record: %v of %d participants, reported %#x", d, count, reported)
	case d == base.DecisionCommit && count == 0:
		return id, 0, 0, 0, 0, corrupt.Errorf("storenode: decide record: commit of no participant")
	}
	return id, d, count, lease, reported, nil
}

func appendTxnReportedRecord(dst []byte, id base.TxnID, index uint16) []byte {
	dst = append(dst, id[:]...)
	dst = binary.LittleEndian.AppendUint16(dst, index)
	return append(dst, 0, 0, 0, 0, 0, 0)
}

func decodeTxnReportedRecord(p []byte) (id base.TxnID, index uint16, err error) {
	if len(p) != txnReportedBytes {
		return id, 0, corrupt.Errorf("storenode: reported record of %d bytes", len(p))
	}
	copy(id[:], p)
	index = binary.LittleEndian.Uint16(p[16:])
	if index >= txnParticipantsMax || binary.LittleEndian.Uint16(p[18:]) != 0 || binary.LittleEndian.Uint32(p[20:]) != 0 {
		return id, 0, corrupt.Errorf("storenode: reported record: participant %d or reserved bytes not zero", index)
	}
	return id, index, nil
}

func appendTxnApplyRecord(dst []byte, id base.TxnID, d base.Decision, index uint16, primary string) []byte {
	dst = append(dst, id[:]...)
	dst = append(dst, byte(d), 0)
	dst = binary.LittleEndian.AppendUint16(dst, index)
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(primary)))
	dst = binary.LittleEndian.AppendUint16(dst, 0)
	return appendPadded(dst, primary)
}

func decodeTxnApplyRecord(p []byte) (id base.TxnID, d base.Decision, index uint16, primary string, err error) {
	if len(p) < txnApplyFixed {
		return id, 0, 0, "", corrupt.Errorf("storenode: apply record of %d bytes", len(p))
	}
	copy(id[:], p)
	d, index = base.Decision(p[16]), binary.LittleEndian.Uint16(p[18:])
	n := int(binary.LittleEndian.Uint16(p[20:]))
	switch {
	case d != base.DecisionCommit && d != base.DecisionAbort:
		return id, 0, 0, "", corrupt.Errorf("storenode: apply record: decision %d", d)
	case p[17] != 0 || binary.LittleEndian.Uint16(p[22:]) != 0:
		return id, 0, 0, "", corrupt.Errorf("storenode: apply record: reserved bytes not zero")
	case index >= txnParticipantsMax || n > txnPrimaryBytesMax || len(p) != txnApplyFixed+padTo8(n):
		return id, 0, 0, "", corrupt.Errorf("storenode: apply record: participant %d, primary of %d bytes in %d", index, n, len(p))
	}
	for _, c := range p[txnApplyFixed+n:] {
		if c != 0 {
			return id, 0, 0, "", corrupt.Errorf("storenode: apply record: padding not zero")
		}
	}
	return id, d, index, string(p[txnApplyFixed : txnApplyFixed+n]), nil
}

func appendTxnForgotRecord(dst []byte, ids []base.TxnID) []byte {
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(ids)))
	dst = append(dst, 0, 0, 0, 0, 0, 0)
	for i := range ids {
		dst = append(dst, ids[i][:]...)
	}
	return dst
}

// decodeTxnForgotRecord decodes a kindTxnForgot payload, calling fn with each id in order;
// every error wraps corrupt.ErrCorruption (fn is called only once the record is whole).
func decodeTxnForgotRecord(p []byte, fn func(base.TxnID)) error {
	if len(p) < txnForgotFixed {
		return corrupt.Errorf("storenode: forgot record of %d bytes", len(p))
	}
	n := int(binary.LittleEndian.Uint16(p))
	switch {
	case n == 0 || n > txnForgotIDsMax || len(p) != txnForgotFixed+n*txnIDBytes:
		return corrupt.Errorf("storenode: forgot record of %d ids in %d bytes", n, len(p))
	case binary.LittleEndian.Uint16(p[2:]) != 0 || binary.LittleEndian.Uint32(p[4:]) != 0:
		return corrupt.Errorf("storenode: forgot record: reserved bytes not zero")
	}
	for i := range n {
		fn(base.TxnID(p[txnForgotFixed+i*txnIDBytes:]))
	}
	return nil
}
