package logicpage

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// mustGeometry returns the geometry of rowBytes or fails the test.
func mustGeometry(tb testing.TB, rowBytes int) Geometry {
	tb.Helper()
	g, err := NewGeometry(rowBytes)
	require.NoError(tb, err)
	return g
}

func TestNewGeometry(t *testing.T) {
	tests := []struct {
		rowBytes      int
		ok            bool
		pageBytes     int
		diskPageBytes int
	}{
		{rowBytes: -8},
		{rowBytes: 0},
		{rowBytes: 7},
		{rowBytes: 8, ok: true, pageBytes: 512, diskPageBytes: 4096},
		{rowBytes: 12},
		{rowBytes: 16, ok: true, pageBytes: 1024, diskPageBytes: 4096},
		{rowBytes: 64, ok: true, pageBytes: 4096, diskPageBytes: 4096},
		{rowBytes: 72, ok: true, pageBytes: 4608, diskPageBytes: 8192},
		{rowBytes: 128, ok: true, pageBytes: 8192, diskPageBytes: 8192},
		{rowBytes: 200, ok: true, pageBytes: 12800, diskPageBytes: 16384},
		{rowBytes: 4088, ok: true, pageBytes: 261632, diskPageBytes: 262144},
		{rowBytes: 4095},
		{rowBytes: 4096, ok: true, pageBytes: 262144, diskPageBytes: 262144},
		{rowBytes: 4104},
		{rowBytes: math.MaxInt},
	}
	for _, tt := range tests {
		g, err := NewGeometry(tt.rowBytes)
		if !tt.ok {
			require.ErrorIs(t, err, ErrRowSize, "row size %d", tt.rowBytes)
			require.Equal(t, Geometry{}, g)
			continue
		}
		require.NoError(t, err, "row size %d", tt.rowBytes)
		require.Equal(t, tt.rowBytes, g.RowBytes())
		require.Equal(t, tt.pageBytes, g.PageBytes())
		require.Equal(t, tt.diskPageBytes, g.DiskPageBytes())
		require.Zero(t, g.DiskPageBytes()%DiskPageAlign)
		require.GreaterOrEqual(t, g.DiskPageBytes(), g.PageBytes())
		require.Less(t, g.DiskPageBytes()-g.PageBytes(), DiskPageAlign)
		require.Equal(t, 0, g.RowOffset(0))
		require.Equal(t, tt.rowBytes, g.RowOffset(1))
		require.Equal(t, 63*tt.rowBytes, g.RowOffset(63))
		require.Equal(t, 0, g.MaskBytes(0))
		require.Equal(t, 3*tt.rowBytes, g.MaskBytes(0b1011))
		require.Equal(t, g.PageBytes(), g.MaskBytes(math.MaxUint64))
	}
}

func TestRowOffsetPanicsOutOfRange(t *testing.T) {
	g := mustGeometry(t, 64)
	for _, slot := range []int{-1, RowsPerPage, math.MaxInt} {
		require.Panics(t, func() { g.RowOffset(slot) }, "slot %d", slot)
	}
}

func TestPageOfRowID(t *testing.T) {
	tests := []struct {
		id   uint64
		page uint64
		slot int
	}{
		{0, 0, 0},
		{1, 0, 1},
		{63, 0, 63},
		{64, 1, 0},
		{65, 1, 1},
		{64*1000 + 17, 1000, 17},
		{math.MaxUint64, PageMax, 63},
		{math.MaxUint64 - 63, PageMax, 0},
	}
	for _, tt := range tests {
		page, slot := PageOf(tt.id)
		require.Equal(t, tt.page, page, "id %d", tt.id)
		require.Equal(t, tt.slot, slot, "id %d", tt.id)
		require.Equal(t, tt.id, RowID(tt.page, tt.slot))
	}

	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	for range 10000 {
		id := rng.Uint64()
		page, slot := PageOf(id)
		require.Less(t, slot, RowsPerPage)
		require.LessOrEqual(t, page, uint64(PageMax))
		require.Equal(t, id, RowID(page, slot), "seed %d id %d", seed, id)
	}
}

func TestRowIDPanicsOutOfRange(t *testing.T) {
	require.Panics(t, func() { RowID(0, -1) })
	require.Panics(t, func() { RowID(0, RowsPerPage) })
	require.Panics(t, func() { RowID(PageMax+1, 0) })
	require.NotPanics(t, func() { RowID(PageMax, 63) })
}
