package sgio

import (
	"context"
	"fmt"
)

// Two-phase commit messages (docs/cluster.md, "Two-phase commit"; docs/wire.md). A
// coordinator (a transaction node) sends TxnPrepare to every participant storage node,
// TxnDecide to the transaction's primary, then TxnApply to every participant; a participant's
// resolver sends TxnAsk and TxnReport to the primary. Every field is little-endian; Txn is the
// coordinator's 16-byte transaction id.
//
//	TxnPrepare  txn [16] | lease i64 | index u16 | primary length u16 | reserved u32
//	            | primary (host:port; empty: the receiver is the primary), zero-padded to 8
//	            | a Commit body (the batch, fenced and deduplicated as a Commit)
//	            -> CommitAck {LSN of the prepare record, seq}
//	TxnDecide   txn [16] | lease i64 | decision u8 | reserved u8 | count u16 | reserved u32
//	            -> TxnState (the recorded decision) or Error ErrTxnDecided
//	TxnApply    txn [16] | decision u8 | reserved [7]                -> OK
//	TxnAsk      txn [16] | lease i64                                 -> TxnState
//	TxnReport   txn [16] | index u16 | reserved [6]                  -> OK
//	TxnState    decision u8 | reserved [7]
//
// Decisions: 0 none (TxnState only: undecided), 1 commit, 2 abort. Part of the format; do not
// change.

// Message types of the two-phase commit. Part of the format; do not change.
const (
	TypeTxnPrepare Type = 0x60 // TxnPrepare -> CommitAck
	TypeTxnDecide  Type = 0x61 // TxnDecide -> TxnState
	TypeTxnApply   Type = 0x62 // TxnApply -> OK
	TypeTxnAsk     Type = 0x63 // TxnAsk -> TxnState
	TypeTxnReport  Type = 0x64 // TxnReport -> OK
	TypeTxnState   Type = 0xe1
)

// TxnIDSize is the length of a transaction id.
const TxnIDSize = 16

// Limits of the two-phase commit messages.
const (
	// TxnPrimaryMax bounds TxnPrepare.Primary.
	TxnPrimaryMax = 255
	// TxnParticipantsMax bounds a transaction's participants (TxnDecide.Count) and so
	// TxnPrepare.Index and TxnReport.Index (below it).
	TxnParticipantsMax = 64
)

// Decisions of TxnDecide, TxnApply and TxnState. Part of the format; do not change.
const (
	TxnNone   uint8 = 0
	TxnCommit uint8 = 1
	TxnAbort  uint8 = 2
)

const txnPrepareFixed = 32

// TxnPrepare makes a participant's batch durable as prepared (not applied, its rows locked).
type TxnPrepare struct {
	Txn     [TxnIDSize]byte
	Lease   int64  // the coordinator's etcd lease
	Index   uint16 // this participant's index, < TxnParticipantsMax
	Primary string // the primary's host:port, at most TxnPrimaryMax bytes; empty: the receiver
	Commit  Commit // the batch
}

// Type reports TypeTxnPrepare.
func (*TxnPrepare) Type() Type { return TypeTxnPrepare }

// BodySize reports the encoded body length.
func (m *TxnPrepare) BodySize() int {
	return txnPrepareFixed + pad8(len(m.Primary)) + m.Commit.BodySize()
}

// AppendTxnPrepareHeader appends a TxnPrepare body's fields before its Commit body.
func AppendTxnPrepareHeader(dst []byte, txn [TxnIDSize]byte, lease int64, index uint16, primary string) []byte {
	start := len(dst)
	dst = append(dst, txn[:]...)
	dst = le64(dst, uint64(lease))
	dst = le16(dst, index)
	dst = le16(dst, uint16(len(primary)))
	dst = le32(dst, 0)
	dst = append(dst, primary...)
	return appendPad(dst, start)
}

// AppendBody appends the encoded body, copying the rows.
func (m *TxnPrepare) AppendBody(dst []byte) []byte {
	return m.Commit.AppendBody(AppendTxnPrepareHeader(dst, m.Txn, m.Lease, m.Index, m.Primary))
}

// TxnPrepareView is a TxnPrepare body checked by ViewTxnPrepare: its fields, and its Commit
// body aliasing the frame's.
type TxnPrepareView struct {
	Txn     [TxnIDSize]byte
	Lease   int64
	Index   uint16
	Primary string
	Commit  CommitView
	Body    []byte // the Commit body
}

// ViewTxnPrepare checks a TxnPrepare body (the Commit body with ViewCommit) without filling
// slices.
func ViewTxnPrepare(body []byte) (TxnPrepareView, error) {
	var v TxnPrepareView
	r := bodyReader{t: TypeTxnPrepare, b: body}
	copy(v.Txn[:], r.take(TxnIDSize))
	v.Lease = int64(r.u64())
	v.Index = r.u16()
	n := int(r.u16())
	r.reserved32()
	if r.err == nil && (v.Index >= TxnParticipantsMax || n > TxnPrimaryMax) {
		r.fail(24, "participant %d, primary of %d bytes", v.Index, n)
	}
	v.Primary = string(r.take(n))
	r.align()
	if r.err != nil {
		return TxnPrepareView{}, r.err
	}
	v.Body = body[r.off:]
	c, err := ViewCommit(v.Body)
	if err != nil {
		return TxnPrepareView{}, fmt.Errorf("sgio: TxnPrepare: %w", err)
	}
	v.Commit = c
	return v, nil
}

// Parse decodes body; the segments' rows alias it.
func (m *TxnPrepare) Parse(body []byte) error {
	v, err := ViewTxnPrepare(body)
	if err != nil {
		return err
	}
	m.Txn, m.Lease, m.Index, m.Primary = v.Txn, v.Lease, v.Index, v.Primary
	return m.Commit.Parse(v.Body)
}

// Validate checks the index, the primary and the batch.
func (m *TxnPrepare) Validate() error {
	if m.Index >= TxnParticipantsMax || len(m.Primary) > TxnPrimaryMax {
		return fmt.Errorf("sgio: TxnPrepare of participant %d, primary of %d bytes: %w", m.Index, len(m.Primary), ErrMalformed)
	}
	return m.Commit.Validate()
}

func checkDecision(d uint8, none bool) error {
	if d == TxnCommit || d == TxnAbort || none && d == TxnNone {
		return nil
	}
	return fmt.Errorf("sgio: transaction decision %d: %w", d, ErrMalformed)
}

// TxnDecide records a transaction's decision at its primary: a compare-and-set.
type TxnDecide struct {
	Txn      [TxnIDSize]byte
	Lease    int64
	Decision uint8  // TxnCommit or TxnAbort
	Count    uint16 // participants: 1..TxnParticipantsMax for commit, 0 (unknown) allowed for abort
}

// Type reports TypeTxnDecide.
func (*TxnDecide) Type() Type { return TypeTxnDecide }

// BodySize reports the encoded body length.
func (*TxnDecide) BodySize() int { return 32 }

// AppendBody appends the encoded body.
func (m *TxnDecide) AppendBody(dst []byte) []byte {
	dst = append(dst, m.Txn[:]...)
	dst = le64(dst, uint64(m.Lease))
	dst = append(dst, m.Decision, 0)
	dst = le16(dst, m.Count)
	return le32(dst, 0)
}

// Parse decodes body.
func (m *TxnDecide) Parse(body []byte) error {
	r := bodyReader{t: TypeTxnDecide, b: body}
	copy(m.Txn[:], r.take(TxnIDSize))
	m.Lease = int64(r.u64())
	m.Decision = r.u8()
	r.reserved8()
	m.Count = r.u16()
	r.reserved32()
	if r.err == nil {
		r.check(m.Validate())
	}
	return r.done()
}

// Validate checks the decision and the count.
func (m *TxnDecide) Validate() error {
	if err := checkDecision(m.Decision, false); err != nil {
		return err
	}
	if m.Count > TxnParticipantsMax || m.Decision == TxnCommit && m.Count == 0 {
		return fmt.Errorf("sgio: TxnDecide of %d participants: %w", m.Count, ErrMalformed)
	}
	return nil
}

// TxnApply tells a participant the decision: apply (commit) or drop (abort) its prepared batch.
type TxnApply struct {
	Txn      [TxnIDSize]byte
	Decision uint8 // TxnCommit or TxnAbort
}

// Type reports TypeTxnApply.
func (*TxnApply) Type() Type { return TypeTxnApply }

// BodySize reports the encoded body length.
func (*TxnApply) BodySize() int { return 24 }

// AppendBody appends the encoded body.
func (m *TxnApply) AppendBody(dst []byte) []byte {
	dst = append(dst, m.Txn[:]...)
	return append(dst, m.Decision, 0, 0, 0, 0, 0, 0, 0)
}

// Parse decodes body.
func (m *TxnApply) Parse(body []byte) error {
	r := bodyReader{t: TypeTxnApply, b: body}
	copy(m.Txn[:], r.take(TxnIDSize))
	m.Decision = r.u8()
	r.reserved8()
	r.reserved16()
	r.reserved32()
	if r.err == nil {
		r.check(m.Validate())
	}
	return r.done()
}

// Validate checks the decision.
func (m *TxnApply) Validate() error { return checkDecision(m.Decision, false) }

// TxnAsk asks a primary for a transaction's decision (a participant's resolver).
type TxnAsk struct {
	Txn   [TxnIDSize]byte
	Lease int64 // the coordinator's lease, from the participant's prepare
}

// Type reports TypeTxnAsk.
func (*TxnAsk) Type() Type { return TypeTxnAsk }

// BodySize reports the encoded body length.
func (*TxnAsk) BodySize() int { return 24 }

// AppendBody appends the encoded body.
func (m *TxnAsk) AppendBody(dst []byte) []byte {
	return le64(append(dst, m.Txn[:]...), uint64(m.Lease))
}

// Parse decodes body.
func (m *TxnAsk) Parse(body []byte) error {
	r := bodyReader{t: TypeTxnAsk, b: body}
	copy(m.Txn[:], r.take(TxnIDSize))
	m.Lease = int64(r.u64())
	return r.done()
}

// Validate accepts every TxnAsk.
func (*TxnAsk) Validate() error { return nil }

// TxnReport tells a primary that participant Index applied the transaction's decision.
type TxnReport struct {
	Txn   [TxnIDSize]byte
	Index uint16 // < TxnParticipantsMax
}

// Type reports TypeTxnReport.
func (*TxnReport) Type() Type { return TypeTxnReport }

// BodySize reports the encoded body length.
func (*TxnReport) BodySize() int { return 24 }

// AppendBody appends the encoded body.
func (m *TxnReport) AppendBody(dst []byte) []byte {
	dst = le16(append(dst, m.Txn[:]...), m.Index)
	return append(dst, 0, 0, 0, 0, 0, 0)
}

// Parse decodes body.
func (m *TxnReport) Parse(body []byte) error {
	r := bodyReader{t: TypeTxnReport, b: body}
	copy(m.Txn[:], r.take(TxnIDSize))
	m.Index = r.u16()
	r.reserved16()
	r.reserved32()
	if r.err == nil {
		r.check(m.Validate())
	}
	return r.done()
}

// Validate checks the index.
func (m *TxnReport) Validate() error {
	if m.Index >= TxnParticipantsMax {
		return fmt.Errorf("sgio: TxnReport of participant %d: %w", m.Index, ErrMalformed)
	}
	return nil
}

// TxnState answers TxnDecide and TxnAsk: the recorded decision (TxnNone: undecided).
type TxnState struct {
	Decision uint8
}

// Type reports TypeTxnState.
func (*TxnState) Type() Type { return TypeTxnState }

// BodySize reports the encoded body length.
func (*TxnState) BodySize() int { return 8 }

// AppendBody appends the encoded body.
func (m *TxnState) AppendBody(dst []byte) []byte { return append(dst, m.Decision, 0, 0, 0, 0, 0, 0, 0) }

// Parse decodes body.
func (m *TxnState) Parse(body []byte) error {
	r := bodyReader{t: TypeTxnState, b: body}
	m.Decision = r.u8()
	r.reserved8()
	r.reserved16()
	r.reserved32()
	if r.err == nil {
		r.check(m.Validate())
	}
	return r.done()
}

// Validate checks the decision.
func (m *TxnState) Validate() error { return checkDecision(m.Decision, true) }

// PrepareTxn sends a TxnPrepare and returns the prepare record's LSN. Like Call, any
// goroutine may call it; ctx bounds the wait.
func (c *Client) PrepareTxn(ctx context.Context, m *TxnPrepare) (uint64, error) {
	var ack CommitAck
	if err := c.CallInto(ctx, m, &ack); err != nil {
		return 0, err
	}
	return ack.LSN, nil
}

// DecideTxn sends a TxnDecide and returns the recorded decision; a different recorded
// decision is an error matching ErrTxnDecided whose message names it.
func (c *Client) DecideTxn(ctx context.Context, txn [TxnIDSize]byte, lease int64, decision uint8, count int) (uint8, error) {
	if count < 0 || count > TxnParticipantsMax {
		return TxnNone, fmt.Errorf("sgio: TxnDecide of %d participants: %w", count, ErrMalformed)
	}
	var st TxnState
	if err := c.CallInto(ctx, &TxnDecide{Txn: txn, Lease: lease, Decision: decision, Count: uint16(count)}, &st); err != nil {
		return TxnNone, err
	}
	return st.Decision, nil
}

// ApplyTxn sends a TxnApply.
func (c *Client) ApplyTxn(ctx context.Context, txn [TxnIDSize]byte, decision uint8) error {
	_, err := c.Call(ctx, &TxnApply{Txn: txn, Decision: decision})
	return err
}

// AskTxn sends a TxnAsk and returns the primary's answer (TxnNone: undecided).
func (c *Client) AskTxn(ctx context.Context, txn [TxnIDSize]byte, lease int64) (uint8, error) {
	var st TxnState
	if err := c.CallInto(ctx, &TxnAsk{Txn: txn, Lease: lease}, &st); err != nil {
		return TxnNone, err
	}
	return st.Decision, nil
}

// ReportTxn sends a TxnReport.
func (c *Client) ReportTxn(ctx context.Context, txn [TxnIDSize]byte, index uint16) error {
	_, err := c.Call(ctx, &TxnReport{Txn: txn, Index: index})
	return err
}
