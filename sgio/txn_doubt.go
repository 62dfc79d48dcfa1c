package sgio

import (
	"context"
	"fmt"
)

// Transactions in doubt, an operator's request (docs/operations.md, "Transactions in doubt";
// docs/wire.md): list the parts a storage node holds prepared for longer than its in-doubt
// bound, or abort one of them. Every field is little-endian.
//
//	TxnDoubt      op u8 | reserved [7] | txn [16]   (op 0: list, txn zero; 1: abort txn)
//	              -> TxnDoubtList
//	TxnDoubtList  total u32 | count u32 | count entries:
//	                txn [16] | owner u64 | lease i64 | age ms u64 | table u32
//	                | primary length u16 | reserved u16 | primary, zero-padded to 8
//
// The list's entries are the oldest count of total (at most TxnDoubtEntriesMax); an abort's
// reply holds the part aborted. Part of the format; do not change.

// Message types of the transactions in doubt. Part of the format; do not change.
const (
	TypeTxnDoubt     Type = 0x65 // TxnDoubt -> TxnDoubtList
	TypeTxnDoubtList Type = 0xe2
)

// TxnDoubt operations. Part of the format; do not change.
const (
	TxnDoubtOpList  uint8 = 0
	TxnDoubtOpAbort uint8 = 1
)

// TxnDoubtEntriesMax bounds a TxnDoubtList's entries (about 80 KiB at most).
const TxnDoubtEntriesMax = 256

const txnDoubtEntryFixed = 48

// TxnDoubt lists the transactions in doubt at a storage node, or aborts one.
type TxnDoubt struct {
	Op  uint8 // TxnDoubtOpList or TxnDoubtOpAbort
	Txn [TxnIDSize]byte
}

// Type reports TypeTxnDoubt.
func (*TxnDoubt) Type() Type { return TypeTxnDoubt }

// BodySize reports the encoded body length.
func (*TxnDoubt) BodySize() int { return 24 }

// AppendBody appends the encoded body.
func (m *TxnDoubt) AppendBody(dst []byte) []byte {
	dst = append(dst, m.Op, 0, 0, 0, 0, 0, 0, 0)
	return append(dst, m.Txn[:]...)
}

// Parse decodes body.
func (m *TxnDoubt) Parse(body []byte) error {
	r := bodyReader{t: TypeTxnDoubt, b: body}
	m.Op = r.u8()
	r.reserved8()
	r.reserved16()
	r.reserved32()
	copy(m.Txn[:], r.take(TxnIDSize))
	if r.err == nil {
		r.check(m.Validate())
	}
	return r.done()
}

// Validate checks the operation.
func (m *TxnDoubt) Validate() error {
	if m.Op != TxnDoubtOpList && m.Op != TxnDoubtOpAbort {
		return fmt.Errorf("sgio: TxnDoubt operation %d: %w", m.Op, ErrMalformed)
	}
	return nil
}

// TxnDoubtEntry is one transaction part in doubt.
type TxnDoubtEntry struct {
	Txn       [TxnIDSize]byte
	Owner     uint64 // the owner that prepared it
	Lease     int64  // its coordinator's lease
	AgeMillis uint64 // how long it has been prepared
	Table     uint32 // the first table it writes
	Primary   string // the primary's host:port, at most TxnPrimaryMax bytes; empty: the node itself
}

// TxnDoubtList answers TxnDoubt.
type TxnDoubtList struct {
	Total   uint32 // the parts in doubt, listed or not
	Entries []TxnDoubtEntry
}

// Type reports TypeTxnDoubtList.
func (*TxnDoubtList) Type() Type { return TypeTxnDoubtList }

// BodySize reports the encoded body length.
func (m *TxnDoubtList) BodySize() int {
	n := 8
	for i := range m.Entries {
		n += txnDoubtEntryFixed + pad8(len(m.Entries[i].Primary))
	}
	return n
}

// AppendBody appends the encoded body.
func (m *TxnDoubtList) AppendBody(dst []byte) []byte {
	dst = le32(dst, m.Total)
	dst = le32(dst, uint32(len(m.Entries)))
	for i := range m.Entries {
		x := &m.Entries[i]
		start := len(dst)
		dst = append(dst, x.Txn[:]...)
		dst = le64(dst, x.Owner)
		dst = le64(dst, uint64(x.Lease))
		dst = le64(dst, x.AgeMillis)
		dst = le32(dst, x.Table)
		dst = le16(dst, uint16(len(x.Primary)))
		dst = le16(dst, 0)
		dst = append(dst, x.Primary...)
		dst = appendPad(dst, start)
	}
	return dst
}

// Parse decodes body.
func (m *TxnDoubtList) Parse(body []byte) error {
	r := bodyReader{t: TypeTxnDoubtList, b: body}
	m.Total = r.u32()
	off := r.off
	n := r.count(txnDoubtEntryFixed)
	if r.err == nil && n > TxnDoubtEntriesMax {
		r.fail(off, "%d entries, limit %d", n, TxnDoubtEntriesMax)
	}
	m.Entries = nil
	if r.err == nil && n > 0 {
		m.Entries = make([]TxnDoubtEntry, n)
	}
	for i := 0; i < n && r.err == nil; i++ {
		x := &m.Entries[i]
		copy(x.Txn[:], r.take(TxnIDSize))
		x.Owner = r.u64()
		x.Lease = int64(r.u64())
		x.AgeMillis = r.u64()
		x.Table = r.u32()
		lenOff := r.off
		k := int(r.u16())
		r.reserved16()
		if r.err == nil && k > TxnPrimaryMax {
			r.fail(lenOff, "primary of %d bytes, limit %d", k, TxnPrimaryMax)
		}
		x.Primary = string(r.take(k))
		r.align()
	}
	if r.err == nil {
		r.check(m.Validate())
	}
	return r.done()
}

// Validate checks the bounds.
func (m *TxnDoubtList) Validate() error {
	if len(m.Entries) > TxnDoubtEntriesMax || uint64(len(m.Entries)) > uint64(m.Total) {
		return fmt.Errorf("sgio: TxnDoubtList of %d entries (total %d): %w", len(m.Entries), m.Total, ErrMalformed)
	}
	for i := range m.Entries {
		if len(m.Entries[i].Primary) > TxnPrimaryMax {
			return fmt.Errorf("sgio: TxnDoubtList entry of a primary of %d bytes: %w", len(m.Entries[i].Primary), ErrMalformed)
		}
	}
	return nil
}

// TxnsInDoubt lists the transactions in doubt at the storage node: the oldest (at most
// TxnDoubtEntriesMax) and how many there are. Like Call, any goroutine may call it.
func (c *Client) TxnsInDoubt(ctx context.Context) (*TxnDoubtList, error) {
	var l TxnDoubtList
	if err := c.CallInto(ctx, &TxnDoubt{Op: TxnDoubtOpList}, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// AbortInDoubt aborts transaction txn's part in doubt at the storage node and returns it.
func (c *Client) AbortInDoubt(ctx context.Context, txn [TxnIDSize]byte) (TxnDoubtEntry, error) {
	var l TxnDoubtList
	if err := c.CallInto(ctx, &TxnDoubt{Op: TxnDoubtOpAbort, Txn: txn}, &l); err != nil {
		return TxnDoubtEntry{}, err
	}
	if len(l.Entries) != 1 {
		return TxnDoubtEntry{}, fmt.Errorf("sgio: TxnDoubt abort answered with %d entries: %w", len(l.Entries), ErrMalformed)
	}
	return l.Entries[0], nil
}
