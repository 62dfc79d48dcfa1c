package cluster

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzDecodeMove: the move record's decoder never panics, and what it accepts re-encodes to
// the same bytes.
func FuzzDecodeMove(f *testing.F) {
	f.Add(encodeMove(MoveRecord{Created: 5, Rev: 9, Lease: 77, From: "127.0.0.1:1", To: "127.0.0.1:2"}))
	f.Add([]byte{1, 4, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeMove(b)
		if err == nil {
			require.Equal(t, b, encodeMove(r))
		}
	})
}

func TestMoveRecordValue(t *testing.T) {
	r := MoveRecord{Created: 5, Rev: 9, Lease: 77, From: "127.0.0.1:1", To: "127.0.0.1:2"}
	got, err := decodeMove(encodeMove(r))
	require.NoError(t, err)
	require.Equal(t, r, got)
	b := encodeMove(r)
	b[len(b)-1] ^= 1
	_, err = decodeMove(b)
	require.Error(t, err)
	_, err = checkPrefix("/a/move/")
	require.ErrorIs(t, err, ErrInvalid)
}
