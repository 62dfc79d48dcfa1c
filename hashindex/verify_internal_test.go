package hashindex

import (
	"context"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/internal/corrupt"
)

// TestVerifyFindsDuplicates: a bucket row holding one entry twice (with a valid checksum) is
// reported by Verify, on a unique index (the key twice) and a non-unique one (the pair twice).
func TestVerifyFindsDuplicates(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t)
	for _, unique := range []bool{true, false} {
		name := "nonunique"
		if unique {
			name = "unique"
		}
		ix, err := Create(ctx, db, name, Options{KeyBytes: 8, Unique: unique, RowBytes: 256})
		require.NoError(t, err)
		for i := range 20 {
			k := binary.LittleEndian.AppendUint64(nil, uint64(i)*7919)
			require.NoError(t, ix.Insert(ctx, k, uint64(i)+1))
		}
		_, err = ix.Verify(ctx)
		require.NoError(t, err)
		row := make([]byte, ix.fmt.rowBytes)
		done := false
		for r, err := range ix.t.ScanAll(ctx) {
			require.NoError(t, err)
			if r.ID == ix.headerID || r.Data[4] != kindBucket {
				continue
			}
			copy(row, r.Data)
			v, err := ix.fmt.decodeRow(row)
			require.NoError(t, err)
			if v.count == 0 || v.count >= ix.entries {
				continue
			}
			e := ix.fmt.entryBytes
			copy(row[rowHeaderBytes+v.count*e:], row[rowHeaderBytes:rowHeaderBytes+e])
			v.count++
			ix.fmt.encodeRow(row, &v)
			require.NoError(t, ix.t.Put(ctx, r.ID, row))
			done = true
			break
		}
		require.True(t, done, "no bucket row with an entry and room")
		_, err = ix.Verify(ctx)
		require.ErrorIs(t, err, corrupt.ErrCorruption, name)
		require.ErrorContains(t, err, "duplicate", name)
	}
}
