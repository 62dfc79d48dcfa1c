package sgio

import (
	"context"
	"fmt"
)

// Partition move messages (docs/cluster.md, "Moving a partition"; docs/wire.md). A mover (a
// cluster node) drives a partition table's copy from its source storage node to its target
// with Move requests (one op each) and fills the target with MoveWrite. Every field is
// little-endian.
//
//	Move       op u8 | reserved [3] | table u32 | token u64 | floor u64 | next id u64
//	           | max pages u32 | reserved u32                       -> MoveState
//	MoveWrite  a Commit body (owner, seq: ignored; one fence per table, each the mover
//	           epoch; the segments: data rows set, clear slots deleted) -> CommitAck{LSN}
//	MoveState  state u8 | more u8 | reserved u16 | page count u32 | token u64 | next id u64
//	           | pages {u64}
//
// Ops (MoveOp*): 1 status, 2 begin (target: incoming under the mover epoch in token), 3 mark
// (source: token), 4 changes
// (source: up to max pages written since the mark, given token), 5 freeze (source, under the
// mover epoch in token: next id), 6 thaw (the mover epoch in token: a freeze of a higher one
// stays), 7 retire (the mover epoch in token), 8 activate (target: the mover epoch in token,
// floor, next id). A storage node with etcd verifies begin, freeze, thaw, retire and
// activate against etcd's move record and map first (docs/cluster.md). States: 0 live, 1 frozen, 2
// incoming, 3 retired (storenode.MoveState). Type codes 0x70, 0x71 and 0xf0. Part of the
// format; do not change.

// Message types of the partition move. Part of the format; do not change.
const (
	TypeMove      Type = 0x70 // Move -> MoveState
	TypeMoveWrite Type = 0x71 // MoveWrite -> CommitAck
	TypeMoveState Type = 0xf0
)

// Move ops. Part of the format; do not change.
const (
	MoveOpStatus   uint8 = 1
	MoveOpBegin    uint8 = 2
	MoveOpMark     uint8 = 3
	MoveOpChanges  uint8 = 4
	MoveOpFreeze   uint8 = 5
	MoveOpThaw     uint8 = 6
	MoveOpRetire   uint8 = 7
	MoveOpActivate uint8 = 8
)

// MovePagesMax bounds MoveState's pages (and Move's max pages).
const MovePagesMax = 4096

// moveStateMax is the highest state MoveState carries.
const moveStateMax = 3

// Move is one step of a partition move on one storage node.
type Move struct {
	Op       uint8
	Table    uint32
	Token    uint64 // changes: the mark's token; begin, freeze, thaw, retire, activate: the mover epoch
	Floor    uint64 // activate: the grant floor (grants of an epoch above it are taken)
	NextID   uint64 // activate: the frozen source's id high-water mark
	MaxPages uint32 // changes: at most this many pages (0: MovePagesMax)
}

// Type reports TypeMove.
func (*Move) Type() Type { return TypeMove }

// BodySize reports the encoded body length.
func (*Move) BodySize() int { return 40 }

// AppendBody appends the encoded body.
func (m *Move) AppendBody(dst []byte) []byte {
	dst = append(dst, m.Op, 0, 0, 0)
	dst = le32(dst, m.Table)
	dst = le64(dst, m.Token)
	dst = le64(dst, m.Floor)
	dst = le64(dst, m.NextID)
	dst = le32(dst, m.MaxPages)
	return le32(dst, 0)
}

// Parse decodes body.
func (m *Move) Parse(body []byte) error {
	r := bodyReader{t: TypeMove, b: body}
	m.Op = r.u8()
	r.reserved8()
	r.reserved16()
	m.Table = r.u32()
	m.Token = r.u64()
	m.Floor = r.u64()
	m.NextID = r.u64()
	m.MaxPages = r.u32()
	r.reserved32()
	if r.err == nil {
		r.check(m.Validate())
	}
	return r.done()
}

// Validate checks the op and the page bound.
func (m *Move) Validate() error {
	if m.Op < MoveOpStatus || m.Op > MoveOpActivate {
		return fmt.Errorf("sgio: move op %d: %w", m.Op, ErrMalformed)
	}
	if m.MaxPages > MovePagesMax {
		return fmt.Errorf("sgio: move changes of %d pages, at most %d: %w", m.MaxPages, MovePagesMax, ErrMalformed)
	}
	return nil
}

// MoveWrite carries rows of a partition's copy to its incoming table: a Commit body under
// another type (the same fuzzed decoder), applied by the storage node's Engine.MoveWrite.
type MoveWrite struct{ Commit }

// Type reports TypeMoveWrite.
func (*MoveWrite) Type() Type { return TypeMoveWrite }

// MoveState answers a Move: the table's state, and the step's results.
type MoveState struct {
	State  uint8
	More   bool     // changes: more pages remain
	Token  uint64   // mark: the new token
	NextID uint64   // the table's id high-water mark
	Pages  []uint64 // changes: pages written since the mark, ascending
}

// Type reports TypeMoveState.
func (*MoveState) Type() Type { return TypeMoveState }

// BodySize reports the encoded body length.
func (m *MoveState) BodySize() int { return 24 + 8*len(m.Pages) }

// AppendBody appends the encoded body.
func (m *MoveState) AppendBody(dst []byte) []byte {
	more := uint8(0)
	if m.More {
		more = 1
	}
	dst = append(dst, m.State, more, 0, 0)
	dst = le32(dst, uint32(len(m.Pages)))
	dst = le64(dst, m.Token)
	dst = le64(dst, m.NextID)
	for _, p := range m.Pages {
		dst = le64(dst, p)
	}
	return dst
}

// Parse decodes body; the page count is checked against the bytes left and MovePagesMax
// before anything is allocated.
func (m *MoveState) Parse(body []byte) error {
	r := bodyReader{t: TypeMoveState, b: body}
	m.State = r.u8()
	more := r.u8()
	r.reserved16()
	n := r.count(8)
	m.Token = r.u64()
	m.NextID = r.u64()
	m.Pages = m.Pages[:0]
	if r.err == nil && n > MovePagesMax {
		r.fail(4, "%d pages, at most %d", n, MovePagesMax)
	}
	if r.err == nil && more > 1 {
		r.fail(1, "more flag %d", more)
	}
	m.More = more == 1
	for i := 0; i < n && r.err == nil; i++ {
		m.Pages = append(m.Pages, r.u64())
	}
	if r.err == nil {
		r.check(m.Validate())
	}
	return r.done()
}

// Validate checks the state, the page count and the pages' order.
func (m *MoveState) Validate() error {
	if m.State > moveStateMax {
		return fmt.Errorf("sgio: move state %d: %w", m.State, ErrMalformed)
	}
	if len(m.Pages) > MovePagesMax {
		return fmt.Errorf("sgio: move state of %d pages: %w", len(m.Pages), ErrMalformed)
	}
	for i := 1; i < len(m.Pages); i++ {
		if m.Pages[i] <= m.Pages[i-1] {
			return fmt.Errorf("sgio: move state pages not ascending: %w", ErrMalformed)
		}
	}
	return nil
}

// MoveStep sends a Move and returns its answer. Like Call, any goroutine may call it; ctx
// bounds the wait.
func (c *Client) MoveStep(ctx context.Context, m *Move) (*MoveState, error) {
	var st MoveState
	if err := c.CallInto(ctx, m, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// WriteMove sends rows of a partition's copy (MoveWrite) and returns the record's LSN, once
// durable at the target.
func (c *Client) WriteMove(ctx context.Context, m *MoveWrite) (uint64, error) {
	var ack CommitAck
	if err := c.CallInto(ctx, m, &ack); err != nil {
		return 0, err
	}
	return ack.LSN, nil
}
