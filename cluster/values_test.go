package cluster

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/corrupt"
)

func TestValuesRoundTrip(t *testing.T) {
	l := Layout{Partitions: 17, StripePages: 3}
	got, err := decodeTable(encodeTable(l))
	require.NoError(t, err)
	require.Equal(t, l, got)

	for _, a := range []string{"127.0.0.1:7070", strings.Repeat("a", addrBytesMax)} {
		addr, err := decodePartition(encodePartition(a))
		require.NoError(t, err)
		require.Equal(t, a, addr)
	}

	h := Holder{Owner: 42, Incarnation: [16]byte{1, 2, 3}, Addr: "10.0.0.1:9000"}
	gh, err := decodeOwner(encodeOwner(h))
	require.NoError(t, err)
	require.Equal(t, h, gh)
	h.Addr = ""
	gh, err = decodeOwner(encodeOwner(h))
	require.NoError(t, err)
	require.Equal(t, h, gh)
}

// Every flipped byte of every value is caught (the checksum, or a field check before it).
func TestValuesCorruption(t *testing.T) {
	vals := map[string][]byte{
		"table":     encodeTable(Layout{Partitions: 4, StripePages: 1}),
		"partition": encodePartition("127.0.0.1:1"),
		"owner":     encodeOwner(Holder{Owner: 7, Addr: "x:1"}),
	}
	decode := map[string]func([]byte) error{
		"table":     func(b []byte) error { _, err := decodeTable(b); return err },
		"partition": func(b []byte) error { _, err := decodePartition(b); return err },
		"owner":     func(b []byte) error { _, err := decodeOwner(b); return err },
	}
	for name, v := range vals {
		for i := range v {
			b := append([]byte(nil), v...)
			b[i] ^= 0x10
			require.ErrorIs(t, decode[name](b), corrupt.ErrCorruption, "%s byte %d", name, i)
		}
		for n := 0; n < len(v); n++ {
			require.ErrorIs(t, decode[name](v[:n]), corrupt.ErrCorruption, "%s cut to %d", name, n)
		}
		// A value of another kind is refused.
		for other, ov := range vals {
			if other != name {
				require.ErrorIs(t, decode[name](ov), corrupt.ErrCorruption, "%s as %s", other, name)
			}
		}
	}
}

func TestKeysParse(t *testing.T) {
	k := keys{prefix: "/w/"}
	key := k.part("a b.c", 0xdead)
	name, p, err := parseTablePart(key[len(k.partPrefix()):])
	require.NoError(t, err)
	require.Equal(t, "a b.c", name)
	require.Equal(t, uint32(0xdead), p)
	for _, bad := range []string{"", "t", "t/", "/0000000a", "t/000000g0", "t/0000000", "t/0000000A"} {
		_, _, err := parseTablePart(bad)
		require.ErrorIs(t, err, corrupt.ErrCorruption, "%q", bad)
	}
	for _, bad := range []string{"", "a/b", "a\x00", strings.Repeat("x", tableNameMax+1)} {
		require.ErrorIs(t, validTableName(bad), ErrInvalid, "%q", bad)
	}
}
