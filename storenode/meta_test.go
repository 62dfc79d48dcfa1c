package storenode

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/internal/checksum"
	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/internal/vfs"
)

// A store whose meta file an older build wrote (format version 1) is refused with a clear
// error, not misread and not reported as corruption.
func TestOpenRefusesOldMetaFormat(t *testing.T) {
	fs := vfs.NewFaultFS()
	opts := Options{Dir: "db", FS: fs, Logger: quietLogger}
	e, err := Open(opts)
	require.NoError(t, err)
	require.NoError(t, e.Close())
	b, err := fs.ReadFile("db/meta")
	require.NoError(t, err)
	binary.LittleEndian.PutUint32(b[8:], 1)
	body := b[:len(b)-metaTrailerBytes]
	binary.LittleEndian.PutUint32(b[len(body):], checksum.Of(body))
	require.NoError(t, fs.WriteFile("db/meta", b))
	_, err = Open(opts)
	require.ErrorIs(t, err, ErrOldFormat)
	require.NotErrorIs(t, err, corrupt.ErrCorruption)
	require.ErrorContains(t, err, "format version 1")
}

// The owners' windows round-trip through the meta file.
func TestMetaOwnersRoundTrip(t *testing.T) {
	for _, seed := range metaSeeds() {
		m, err := decodeMeta(seed)
		require.NoError(t, err)
		require.Equal(t, seed, encodeMeta(m))
	}
	m, err := decodeMeta(metaSeeds()[0])
	require.NoError(t, err)
	o := m.owners[7]
	ent, ok := o.lookup(3)
	require.True(t, ok)
	h := uint64(0x9e3779b97f4a7c15)
	require.Equal(t, dedupEntry{seq: 3, lsn: 13, hash: 3 * h}, ent)
	_, ok = o.lookup(6)
	require.False(t, ok)
}
