package storenode

import (
	"encoding/binary"
	"runtime"
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
	e := openEngine(t, opts)
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
		if m.version != metaVersion && m.version != metaVersionCluster {
			continue // upgraded: TestMetaDenseUpgrade, TestMetaSparseUpgrade
		}
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

// decodeMeta allocates in proportion to the bytes it decodes: a meta file of many owners with
// a one-batch window each (56 bytes an owner) must not cost a whole 64-entry ring (1,536
// bytes) per owner. Fails on 3d9139f: 30x the file's bytes were allocated.
func TestDecodeMetaMemoryBoundedByBytes(t *testing.T) {
	const owners = 20000
	m := &metaState{ckptLSN: 100, syncedLSN: 100, nextTable: 1, owners: make(map[uint64]ownerState, owners)}
	for id := uint64(1); id <= owners; id++ {
		o := &ownerState{}
		o.remember(5, 9, id)
		m.owners[id] = o.clone()
	}
	b := encodeMeta(m)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	got, err := decodeMeta(b)
	runtime.ReadMemStats(&after)
	require.NoError(t, err)
	require.Len(t, got.owners, owners)
	allocated := after.TotalAlloc - before.TotalAlloc
	require.LessOrEqual(t, allocated, uint64(6*len(b)), "%d bytes allocated to decode %d bytes", allocated, len(b))

	// The compact windows work: lookups, and growing on the next applied batch.
	o := got.owners[77]
	ent, ok := o.lookup(5)
	require.True(t, ok)
	require.Equal(t, dedupEntry{seq: 5, lsn: 9, hash: 77}, ent)
	o.remember(6, 10, 1)
	require.NoError(t, o.verify())
	ent, ok = o.lookup(5)
	require.True(t, ok, "the decoded entry survives the ring's growth")
	require.Equal(t, uint64(9), ent.lsn)
	require.Equal(t, b, encodeMeta(got), "a decoded meta re-encodes to the same bytes")
}

// A version-2 meta file (dense page map) is read, its empty entries dropped, and re-encoded as
// version 3 with the same entries.
func TestMetaDenseUpgrade(t *testing.T) {
	m, err := decodeMeta(denseMetaSeed())
	require.NoError(t, err)
	require.EqualValues(t, metaVersionDense, m.version)
	pm := m.tables[0].pages
	require.Equal(t, 2, pm.count(), "the empty page has no entry")
	require.Equal(t, mapEntry{disk: 2, crc: 7, lsn: 5, present: 3}, pm.get(0))
	require.Equal(t, mapEntry{disk: 1, crc: 8, lsn: 6, present: 1}, pm.get(2))
	m2 := reloadV4(t, m)
	require.EqualValues(t, metaVersion, m2.version)
	require.Equal(t, pm.get(0), m2.tables[0].pages.get(0))
	require.Equal(t, pm.get(2), m2.tables[0].pages.get(2))
	require.Equal(t, 2, m2.tables[0].pages.count())
}

// A version-3 meta file (the sparse page map inside it) is read with every entry and
// re-encoded as version 4 (the map in a map log) with the same entries.
func TestMetaSparseUpgrade(t *testing.T) {
	seeds := metaSeeds()
	m, err := decodeMeta(seeds[len(seeds)-1])
	require.NoError(t, err)
	require.EqualValues(t, metaVersionSparse, m.version)
	pm := m.tables[0].pages
	require.Equal(t, 4, pm.count())
	m2 := reloadV4(t, m)
	require.EqualValues(t, metaVersion, m2.version)
	require.Equal(t, m.tables[0].pages.count(), m2.tables[0].pages.count())
	for page, ent := range pm.all() {
		require.Equal(t, ent, m2.tables[0].pages.get(page))
	}
	require.Zero(t, m2.tables[1].pages.count())
}

// reloadV4 encodes m as version 4 with its map log and decodes both.
func reloadV4(t *testing.T, m *metaState) *metaState {
	t.Helper()
	mb, lb := encodeMetaAndLog(m)
	m2, err := decodeMeta(mb)
	require.NoError(t, err)
	require.NoError(t, decodeMapLog(lb, m2.logGen, m2, false))
	return m2
}

// A page map of many leaves far apart (one entry each, every leaf under its own inner node)
// decodes into memory in proportion to its bytes: the tree's nodes hold only the kids and
// entries that exist.
func TestDecodeSparseMetaMemoryBoundedByBytes(t *testing.T) {
	ents := make(map[uint64]mapEntry)
	for i := uint64(0); i < 20000; i++ {
		ents[i*4096+63] = mapEntry{disk: uint32(i + 1), crc: uint32(i), lsn: 1, present: 1 << 63}
	}
	m := &metaState{ckptLSN: 1, syncedLSN: 1, nextTable: 2, owners: map[uint64]ownerState{},
		tables: []metaTable{{id: 1, rowBytes: 64, name: "t", nextID: MaxRowID, pages: pageMapOf(ents)}}}
	mb, b := encodeMetaAndLog(m)
	got, err := decodeMeta(mb)
	require.NoError(t, err)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	err = decodeMapLog(b, got.logGen, got, false)
	runtime.ReadMemStats(&after)
	require.NoError(t, err)
	require.Equal(t, len(ents), got.tables[0].pages.count())
	allocated := after.TotalAlloc - before.TotalAlloc
	require.LessOrEqual(t, allocated, uint64(12*len(b)), "%d bytes allocated to decode %d bytes", allocated, len(b))
	t.Logf("%d bytes decoded, %d allocated, %d held", len(b), allocated, got.tables[0].pages.memBytes())
	require.Less(t, got.tables[0].pages.memBytes(), 8*len(b))
}
