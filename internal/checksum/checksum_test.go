package checksum

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestKnownValue(t *testing.T) {
	// The CRC32C check value from the iSCSI specification (RFC 3720, B.4).
	require.Equal(t, uint32(0xe3069283), Of([]byte("123456789")))
}

func TestUpdateEqualsWhole(t *testing.T) {
	b := []byte("sparse scatter-gather page io")
	require.Equal(t, Of(b), Update(Update(0, b[:7]), b[7:]))
}
