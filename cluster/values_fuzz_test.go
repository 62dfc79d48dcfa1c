package cluster

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/corrupt"
)

// FuzzDecodeValues feeds arbitrary bytes to every decoder of values and keys read from etcd:
// each either fails with corruption or returns a value that encodes back to the same bytes.
func FuzzDecodeValues(f *testing.F) {
	f.Add(encodeTable(Layout{Partitions: 3, StripePages: 2}))
	f.Add(encodePartition("127.0.0.1:7070"))
	f.Add(encodeOwner(Holder{Owner: 9, Incarnation: [16]byte{9}, Addr: "h:1"}))
	f.Add(encodeOwner(Holder{Owner: 9, Addr: "h:1", WriteBack: true}))
	f.Add(encodeFlush(12))
	f.Add(encodeFlushed(12, 7))
	f.Add([]byte("t/0000000f"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		if l, err := decodeTable(b); err == nil {
			require.NoError(t, l.Validate())
			require.Equal(t, b, encodeTable(l))
		} else {
			require.ErrorIs(t, err, corrupt.ErrCorruption)
		}
		if a, err := decodePartition(b); err == nil {
			require.Equal(t, b, encodePartition(a))
		} else {
			require.ErrorIs(t, err, corrupt.ErrCorruption)
		}
		if h, err := decodeOwner(b); err == nil {
			require.NotZero(t, h.Owner)
			require.Equal(t, b, encodeOwner(h))
		} else {
			require.ErrorIs(t, err, corrupt.ErrCorruption)
		}
		if e, err := decodeFlush(b); err == nil {
			require.Equal(t, b, encodeFlush(e))
		} else {
			require.ErrorIs(t, err, corrupt.ErrCorruption)
		}
		if e, g, err := decodeFlushed(b); err == nil {
			require.Equal(t, b, encodeFlushed(e, g))
		} else {
			require.ErrorIs(t, err, corrupt.ErrCorruption)
		}
		if name, p, err := parseTablePart(string(b)); err == nil {
			require.Equal(t, string(b), keys{}.part(name, p)[len(keys{}.partPrefix()):])
		} else {
			require.ErrorIs(t, err, corrupt.ErrCorruption)
		}
	})
}
