package repl

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// FuzzDecodeEnvelope feeds arbitrary records (kind, payload) to the log store's decoders:
// none panics, and whatever decodes encodes back to the same bytes.
func FuzzDecodeEnvelope(f *testing.F) {
	seed := func(e *raftpb.Entry) {
		r, err := encodeEntry(e)
		require.NoError(f, err)
		f.Add(r.kind, append(r.header[:], r.payload...))
	}
	seed(&raftpb.Entry{Term: proto.Uint64(3), Index: proto.Uint64(7), Data: EncodeEntryData(6, 99, []byte("commit body, 8-aligned"))})
	seed(&raftpb.Entry{Term: proto.Uint64(1), Index: proto.Uint64(1)})
	cc := raftpb.EntryConfChangeV2
	seed(&raftpb.Entry{Term: proto.Uint64(2), Index: proto.Uint64(5), Type: &cc, Data: []byte{8, 1, 16, 2}})
	st := encodeState(logState{term: 4, vote: 2, commit: 9, compactedIndex: 3, compactTerm: 1})
	f.Add(kindRaftState, st[:])
	tr := encodeTruncate(truncation{index: 11, term: 4})
	f.Add(kindRaftTruncate, tr[:])
	f.Add(byte(0), []byte{})
	f.Add(byte(36), make([]byte, 24))
	f.Fuzz(func(t *testing.T, kind byte, payload []byte) {
		switch kind {
		case kindRaftState:
			if st, err := decodeState(payload); err == nil {
				b := encodeState(st)
				require.Equal(t, payload, b[:])
			}
		case kindRaftTruncate:
			if tr, err := decodeTruncate(payload); err == nil {
				b := encodeTruncate(tr)
				require.Equal(t, payload, b[:])
			}
		default:
			e, err := decodeEntry(kind, payload)
			if err != nil {
				return
			}
			r, err := encodeEntry(e)
			require.NoError(t, err, "a decoded entry encodes")
			require.Equal(t, kind, r.kind)
			require.True(t, bytes.Equal(payload, append(r.header[:], r.payload...)), "round trip")
		}
	})
}
