package sgio

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzMoveMessages is FuzzMessages seeded with and restricted to the partition move's
// messages (move.go): no parser panics, every failure is malformed, every accepted body
// re-encodes to itself.
func FuzzMoveMessages(f *testing.F) {
	moveTypes := []Type{TypeMove, TypeMoveWrite, TypeMoveState}
	addBodySeeds(f, moveTypes)
	f.Add(uint8(2), []byte{0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, pick uint8, body []byte) {
		checkBody(t, moveTypes[int(pick)%len(moveTypes)], body)
	})
}

// A MoveState's page count is bounded before anything is allocated, and its pages must
// ascend.
func TestMoveStateBounds(t *testing.T) {
	big := (&MoveState{}).AppendBody(nil)
	big[4], big[5] = 0x01, 0x10 // 4097 pages claimed, none present
	require.ErrorIs(t, new(MoveState).Parse(big), ErrMalformed)
	body := (&MoveState{Pages: make([]uint64, MovePagesMax+1)}).AppendBody(nil)
	require.ErrorIs(t, new(MoveState).Parse(body), ErrMalformed)
	body = (&MoveState{Pages: []uint64{3, 3}}).AppendBody(nil)
	require.ErrorIs(t, new(MoveState).Parse(body), ErrMalformed)
	require.ErrorIs(t, (&Move{Op: 9}).Validate(), ErrMalformed)
}
