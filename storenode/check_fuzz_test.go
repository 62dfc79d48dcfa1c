package storenode

import (
	"bytes"
	"context"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/checksum"
	"github.com/weftdb/weft/internal/vfs"
)

// fuzzStoreFiles builds a small store in memory (commits, a checkpoint, more commits) and
// returns its meta file, the data file of its table and its WAL segment, as a running store
// has them (open) when open is set, else after Close.
func fuzzStoreFiles(t testing.TB, open bool) (meta, data, seg []byte) {
	ffs := vfs.NewFaultFS()
	e := openEngine(t, Options{Dir: "db", FS: ffs, CheckpointWALBytes: -1, CheckpointInterval: -1, Logger: quietLogger})
	ti, g := ownedTable(t, e, "t", 16, 3, 4)
	for i := uint64(1); i <= 6; i++ {
		if i == 4 {
			require.NoError(t, e.Checkpoint())
		}
		commitWait(t, e, &base.Batch{Owner: 3, Seq: i, Fences: []base.Fence{{Table: ti.ID, Epoch: g.Epoch}},
			Segments: []base.Segment{{Table: ti.ID, Page: i % 3, Data: 0x5 << i, Clear: 0x10000,
				Rows: checkRows(2, 16, i, i)}}})
	}
	if !open {
		require.NoError(t, e.Close())
	}
	read := func(name string) []byte {
		b, err := ffs.ReadFile(name)
		require.NoError(t, err)
		return b
	}
	meta, data, seg = read("db/meta"), read("db/table-00000001.dat"), read("db/wal/wal-0000000000000001.log")
	if open {
		require.NoError(t, e.Close())
	}
	return meta, data, seg
}

// FuzzCheck feeds Check a store of arbitrary meta, data and WAL bytes: it must not panic,
// must change none of them, and must keep its report within its bounds. With seal set the
// meta file's checksum is made to match, so mutations reach the page maps and the catalog.
func FuzzCheck(f *testing.F) {
	for _, open := range []bool{false, true} {
		meta, data, seg := fuzzStoreFiles(f, open)
		f.Add(meta, data, seg, false)
		f.Add(meta, data, seg, true)
	}
	f.Add([]byte{}, []byte{}, []byte{}, false)
	f.Fuzz(func(t *testing.T, meta, data, seg []byte, seal bool) {
		if seal && len(meta) >= metaHeaderBytes+metaTrailerBytes {
			meta = bytes.Clone(meta)
			body := len(meta) - metaTrailerBytes
			binary.LittleEndian.PutUint32(meta[body:], checksum.Of(meta[:body]))
			binary.LittleEndian.PutUint32(meta[body+4:], 0)
		}
		ffs := vfs.NewFaultFS()
		require.NoError(t, ffs.MkdirAll("db/wal"))
		files := map[string][]byte{"db/meta": meta, "db/table-00000001.dat": data, "db/wal/wal-0000000000000001.log": seg}
		for name, b := range files {
			require.NoError(t, ffs.WriteFile(name, b))
		}
		rep, err := Check(context.Background(), "db", CheckOptions{FS: ffs, MaxFindings: 16})
		if err == nil {
			require.LessOrEqual(t, len(rep.Findings), 16)
			require.GreaterOrEqual(t, rep.DamageCount(), 0)
			for _, fd := range rep.Findings {
				require.NotEmpty(t, fd.What)
			}
		}
		for name, b := range files {
			got, err := ffs.ReadFile(name)
			require.NoError(t, err)
			require.Equal(t, b, got, name)
		}
		names, err := ffs.List("db")
		require.NoError(t, err)
		require.Equal(t, []string{"meta", "table-00000001.dat", "wal"}, names)
	})
}
