package storenode

import (
	"encoding/binary"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/corrupt"
)

// WAL record kinds that only a replicated store writes (docs/replication.md 1.2; a standalone
// engine, Options.Proposer nil, writes none of them, so its WAL is byte for byte what it was).
// Replay accepts them all the same: a replica reopens from its own log. Integers
// little-endian.
//
//	kindExpired      count u16 (1..expiredOwnersMax) | reserved [6]
//	                 | {owner u64 | seq u64} x count
//
// An expiry record is the leader's decision (on its clock, at its checkpoint tick) that the
// owners named have been idle past Options.OwnerExpiry; seq is each owner's last applied seq
// when it was decided. Its apply drops an owner only if that seq is still its last and it
// holds no table, so a batch applied in between keeps the owner on every replica alike.
// Kinds 17 (owner claim) and 18 (owner release) are left for the identities' records.
//
//	kindTxnExpired   count u16 (1..expiredTxnsMax) | reserved [6]
//	                 | {txn [16] | decide LSN u64} x count
//
// A decision expiry record is the leader's sweep of the aborts it keeps as primary
// (sweepTxnDecisions' rule, on its clock): each named abort every participant reported (its
// records durable), or older than Options.TxnAbortKeep. Its apply forgets an abort only if
// the decision kept for the id is still the abort decided at that LSN. It is an entry of the
// group's log only (ApplyCommitted): a standalone engine's sweep logs nothing, so replay and
// Check refuse the kind in an engine's WAL.
//
// Part of the format; do not change.
const (
	kindExpired    byte = 19
	kindTxnExpired byte = 20

	// expiredFixed is an expiry record's header; expiredOwnerBytes one owner's entry.
	expiredFixed      = 8
	expiredOwnerBytes = 16
	// expiredOwnersMax bounds the owners of one expiry record (16 KiB of entries): the
	// leader proposes the rest at its next checkpoint.
	expiredOwnersMax = 1024

	// expiredTxnBytes is one decision's entry of a decision expiry record; expiredTxnsMax
	// bounds its decisions (24 KiB): the leader proposes the rest at its next pass.
	expiredTxnBytes = 24
	expiredTxnsMax  = 1024
)

// expiredTxn is one abort a decision expiry record names and the LSN of its decide record.
type expiredTxn struct {
	id  base.TxnID
	lsn uint64
}

// appendTxnExpiredRecord appends the decision expiry record of txns (1..expiredTxnsMax of
// them) to dst.
func appendTxnExpiredRecord(dst []byte, txns []expiredTxn) []byte {
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(txns)))
	dst = append(dst, 0, 0, 0, 0, 0, 0)
	for _, x := range txns {
		dst = append(dst, x.id[:]...)
		dst = binary.LittleEndian.AppendUint64(dst, x.lsn)
	}
	return dst
}

// decodeTxnExpiredRecord checks decision expiry record p whole, then calls fn for each
// decision it names, in order; a record refused (a corruption error) names none.
func decodeTxnExpiredRecord(p []byte, fn func(expiredTxn)) error {
	if len(p) < expiredFixed {
		return corrupt.Errorf("storenode: decision expiry record of %d bytes", len(p))
	}
	n := int(binary.LittleEndian.Uint16(p))
	switch {
	case n == 0 || n > expiredTxnsMax || len(p) != expiredFixed+n*expiredTxnBytes:
		return corrupt.Errorf("storenode: decision expiry record of %d decisions in %d bytes", n, len(p))
	case binary.LittleEndian.Uint16(p[2:]) != 0 || binary.LittleEndian.Uint32(p[4:]) != 0:
		return corrupt.Errorf("storenode: decision expiry record: reserved bytes not zero")
	}
	for i := range n {
		q := p[expiredFixed+i*expiredTxnBytes:]
		x := expiredTxn{id: base.TxnID(q), lsn: binary.LittleEndian.Uint64(q[txnIDBytes:])}
		if x.lsn == 0 {
			return corrupt.Errorf("storenode: decision expiry record: decision %d at LSN 0", i)
		}
	}
	for i := range n {
		q := p[expiredFixed+i*expiredTxnBytes:]
		fn(expiredTxn{id: base.TxnID(q), lsn: binary.LittleEndian.Uint64(q[txnIDBytes:])})
	}
	return nil
}

// expiredOwner is one owner an expiry record names and its last applied seq then.
type expiredOwner struct {
	owner, seq uint64
}

// appendExpiredRecord appends the expiry record of owners (1..expiredOwnersMax of them) to dst.
func appendExpiredRecord(dst []byte, owners []expiredOwner) []byte {
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(owners)))
	dst = append(dst, 0, 0, 0, 0, 0, 0)
	for _, o := range owners {
		dst = binary.LittleEndian.AppendUint64(dst, o.owner)
		dst = binary.LittleEndian.AppendUint64(dst, o.seq)
	}
	return dst
}

// decodeExpiredRecord checks expiry record p whole, then calls fn for each owner it names, in
// order; a record refused (a corruption error) names none.
func decodeExpiredRecord(p []byte, fn func(expiredOwner)) error {
	if len(p) < expiredFixed {
		return corrupt.Errorf("storenode: expiry record of %d bytes", len(p))
	}
	n := int(binary.LittleEndian.Uint16(p))
	switch {
	case n == 0 || n > expiredOwnersMax || len(p) != expiredFixed+n*expiredOwnerBytes:
		return corrupt.Errorf("storenode: expiry record of %d owners in %d bytes", n, len(p))
	case binary.LittleEndian.Uint16(p[2:]) != 0 || binary.LittleEndian.Uint32(p[4:]) != 0:
		return corrupt.Errorf("storenode: expiry record: reserved bytes not zero")
	}
	for i := range n {
		q := p[expiredFixed+i*expiredOwnerBytes:]
		fn(expiredOwner{owner: binary.LittleEndian.Uint64(q), seq: binary.LittleEndian.Uint64(q[8:])})
	}
	return nil
}
