package storenode

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"
	"testing"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/checksum"
	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/logicpage"
)

// Fuzz targets for the decoders of bytes on disk: the meta file and the WAL records' payloads.
// Every input either decodes to something that encodes back to the same bytes, or fails with
// a corruption error; none panics or allocates beyond its input's claims.

func metaSeeds() [][]byte {
	o := &ownerState{}
	for seq := uint64(1); seq <= 5; seq++ {
		o.remember(seq, seq+10, seq*0x9e3779b97f4a7c15)
	}
	m := &metaState{ckptLSN: 20, syncedLSN: 22, nextTable: 3, owners: map[uint64]ownerState{7: o.clone(), 9: {lastSeq: 3, lastLSN: 4}},
		tables: []metaTable{
			{id: 1, rowBytes: 64, name: "items", nextID: 128, holder: 7, epoch: 2,
				pages: pageMapOf(map[uint64]mapEntry{0: {disk: 1, crc: 0xdeadbeef, lsn: 15, present: 0xff},
					1: {disk: 3, lsn: 16}, 70: {present: 1}, tablePagesMax - 1: {disk: 2, crc: 5, lsn: 17, present: 1 << 63}})},
			{id: 2, rowBytes: 512, name: "b.c-d_e", nextID: 0},
		}}
	empty := &metaState{nextTable: 1, owners: map[uint64]ownerState{}}
	v3 := encodeSparseMeta(m)
	v4, _ := encodeMetaAndLog(m)
	// Version 5: the same with cluster tables (the cluster section).
	mc := *m
	mc.nextTable = 5
	mc.tables = append(slices.Clone(m.tables),
		metaTable{id: 3, rowBytes: 64, name: "acct.p1", nextID: 128, holder: 9, epoch: 1 << 40,
			cluster: base.ClusterLayout{Partitions: 2, StripePages: 1, Partition: 1}},
		metaTable{id: 4, rowBytes: 64, name: "x.p65535", cluster: base.ClusterLayout{Partitions: base.ClusterPartitionsMax,
			StripePages: base.ClusterStripePagesMax, Partition: base.ClusterPartitionsMax - 1}})
	v5, _ := encodeMetaAndLog(&mc)
	return [][]byte{v4, encodeMeta(empty), denseMetaSeed(), v5, v3} // v3 last: TestMetaSparseUpgrade
}

// pageMapOf builds a sealed page map of ents.
func pageMapOf(ents map[uint64]mapEntry) *pageMap {
	pm := (*pageMap)(nil).edit()
	for page, ent := range ents {
		pm.set(page, ent)
	}
	return pm.seal()
}

// denseMetaSeed is a version-2 meta file (a dense page map of 3 pages, the middle one empty),
// as the build before the sparse map wrote it.
func denseMetaSeed() []byte {
	b := binary.LittleEndian.AppendUint64([]byte(metaMagic), metaVersionDense)
	b = binary.LittleEndian.AppendUint64(b, 9)   // checkpoint LSN
	b = binary.LittleEndian.AppendUint32(b, 2)   // next table
	b = binary.LittleEndian.AppendUint32(b, 1)   // tables
	b = binary.LittleEndian.AppendUint64(b, 0)   // owners, reserved
	b = binary.LittleEndian.AppendUint64(b, 9)   // synced LSN
	b = binary.LittleEndian.AppendUint32(b, 1)   // table id
	b = binary.LittleEndian.AppendUint16(b, 64)  // row bytes
	b = binary.LittleEndian.AppendUint16(b, 1)   // name length
	b = binary.LittleEndian.AppendUint64(b, 192) // next id
	b = binary.LittleEndian.AppendUint64(b, 0)   // holder
	b = binary.LittleEndian.AppendUint64(b, 0)   // epoch
	b = binary.LittleEndian.AppendUint64(b, 3)   // page count
	b = append(b, 't', 0, 0, 0, 0, 0, 0, 0)      // name, padded
	for _, ent := range []mapEntry{{disk: 2, crc: 7, lsn: 5, present: 3}, {}, {disk: 1, crc: 8, lsn: 6, present: 1}} {
		b = binary.LittleEndian.AppendUint32(b, ent.disk)
		b = binary.LittleEndian.AppendUint32(b, ent.crc)
		b = binary.LittleEndian.AppendUint64(b, ent.lsn)
		b = binary.LittleEndian.AppendUint64(b, ent.present)
	}
	b = binary.LittleEndian.AppendUint32(b, checksum.Of(b))
	return binary.LittleEndian.AppendUint32(b, 0)
}

// checkMetaRoundTrip checks a meta file's bytes b as the meta fuzzers do: b decodes, or fails
// with a corruption (or old-format) error; what decodes re-encodes to b, or, upgraded from an
// older version, to an encoding that decodes and re-encodes to itself.
func checkMetaRoundTrip(t *testing.T, b []byte) {
	t.Helper()
	m, err := decodeMeta(b)
	if err != nil {
		if !errors.Is(err, corrupt.ErrCorruption) && !errors.Is(err, ErrOldFormat) {
			t.Fatalf("not a corruption error: %v", err)
		}
		return
	}
	got := encodeMeta(m)
	if m.version != metaVersion && m.version != metaVersionCluster {
		// Upgraded: the version-4 encoding decodes to the same state.
		m2, err := decodeMeta(got)
		if err != nil {
			t.Fatalf("upgraded meta does not decode: %v", err)
		}
		if again := encodeMeta(m2); !bytes.Equal(again, got) {
			t.Fatalf("upgraded meta re-encodes differently")
		}
		return
	}
	if !bytes.Equal(got, b) {
		t.Fatalf("decoded meta re-encodes differently:\n got %x\nwant %x", got, b)
	}
}

func FuzzDecodeMeta(f *testing.F) {
	for _, s := range metaSeeds() {
		f.Add(s)
		f.Add(s[:len(s)/2])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		checkMetaRoundTrip(t, b)
	})
}

func commitSeeds() [][]byte {
	rows := make([]byte, 3*64)
	for i := range rows {
		rows[i] = byte(i)
	}
	b := &base.Batch{Owner: 7, Seq: 9, Fences: []base.Fence{{Table: 1, Epoch: 2}}, Segments: []base.Segment{
		{Table: 1, Page: 2, Data: 0b1011, Clear: 0b100, Rows: rows},
		{Table: 2, Page: 0, Clear: 1},
	}}
	rb := func(uint32) int { return 64 }
	kept := make([]byte, 8*64) // a run of rows commitPieces keeps
	for i := range kept {
		kept[i] = byte(i * 7)
	}
	mixed := &base.Batch{Owner: 3, Seq: 4, Fences: []base.Fence{{Table: 1, Epoch: 2}, {Table: 2, Epoch: 5}}, Segments: []base.Segment{
		{Table: 1, Page: 0, Data: 0xff, Rows: kept},
		{Table: 2, Page: 1, Data: 1, Clear: 2, Rows: rows[:64]},
		{Table: 1, Page: 3, Data: 0xff << 8, Rows: kept},
	}}
	return [][]byte{appendCommitRecord(nil, b, batchHash(b), rb), appendCommitRecord(nil, &base.Batch{Owner: 1, Seq: 1}, 0, rb),
		appendCommitRecord(nil, mixed, batchHash(mixed), rb)}
}

func FuzzDecodeCommitRecord(f *testing.F) {
	for _, s := range commitSeeds() {
		f.Add(s)
		f.Add(s[:len(s)-1])
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		var rec commitRecord
		if err := decodeCommitRecord(p, &rec); err != nil {
			if !errors.Is(err, corrupt.ErrCorruption) {
				t.Fatalf("not a corruption error: %v", err)
			}
			return
		}
		b := &base.Batch{Owner: rec.owner, Seq: rec.seq, Fences: rec.fences, Segments: rec.segments}
		// Row sizes are per segment in the record: appendCommitRecord asks once per segment,
		// in order.
		i := 0
		got := appendCommitRecord(nil, b, rec.hash, func(uint32) int { i++; return rec.rowBytes[i-1] })
		if !bytes.Equal(got, p) {
			t.Fatalf("decoded record re-encodes differently:\n got %x\nwant %x", got, p)
		}
		// The commit path's encoder (commitPieces: headers copied, large runs of rows kept)
		// writes the same bytes, when each table has one row size, as in a catalog.
		e := &Engine{tables: make(map[uint32]*table)}
		for i, s := range rec.segments {
			geo, _ := logicpage.NewGeometry(rec.rowBytes[i])
			if t, ok := e.tables[s.Table]; ok && t.geo != geo {
				return
			}
			e.tables[s.Table] = &table{id: s.Table, geo: geo}
		}
		pieces := e.commitPieces(b, rec.hash)
		if got := joinPieces(pieces); !bytes.Equal(got, p) {
			t.Fatalf("commitPieces encodes differently:\n got %x\nwant %x", got, p)
		}
		for _, pc := range pieces {
			if pc.Keep && len(pc.Bytes) < commitKeepBytesMin {
				t.Fatalf("a kept piece of %d bytes", len(pc.Bytes))
			}
		}
	})
}

// FuzzDecodeCatalogRecords covers the small records: table creation and drop, id and
// ownership grants. The first byte picks the decoder.
// fuzzRecordKinds fuzzes kinds decoders of WAL records: the first byte of an input picks the
// kind, decode decodes the rest as that kind and re-encodes it. A decode either succeeds, and
// check compares the re-encoding with the input's record, or fails with a corruption error.
func fuzzRecordKinds(f *testing.F, kinds byte, decode func(t *testing.T, kind byte, p []byte) ([]byte, error),
	check func(t *testing.T, again, p []byte)) {
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) == 0 {
			return
		}
		p := in[1:]
		again, err := decode(t, in[0]%kinds, p)
		if err != nil {
			if !errors.Is(err, corrupt.ErrCorruption) {
				t.Fatalf("not a corruption error: %v", err)
			}
			return
		}
		check(t, again, p)
	})
}

func FuzzDecodeCatalogRecords(f *testing.F) {
	f.Add(append([]byte{0}, appendCreateRecord(nil, 3, 64, "items")...))
	f.Add(append([]byte{1}, appendDropRecord(nil, 3)...))
	f.Add(append([]byte{2}, appendGrantIDsRecord(nil, 3, 640)...))
	f.Add(append([]byte{3}, appendGrantOwnerRecord(nil, 3, 7, 2)...))
	fuzzRecordKinds(f, 4, func(t *testing.T, kind byte, p []byte) (again []byte, err error) {
		switch kind {
		case 0:
			var id uint32
			var rb int
			var name string
			if id, rb, name, err = decodeCreateRecord(p); err == nil {
				again = appendCreateRecord(nil, id, rb, name)
			}
		case 1:
			var id uint32
			if id, err = decodeDropRecord(p); err == nil {
				again = appendDropRecord(nil, id)
			}
		case 2:
			var id uint32
			var next uint64
			if id, next, err = decodeGrantIDsRecord(p); err == nil {
				again = appendGrantIDsRecord(nil, id, next)
			}
		case 3:
			var id uint32
			var owner, epoch uint64
			if id, owner, epoch, err = decodeGrantOwnerRecord(p); err == nil {
				again = appendGrantOwnerRecord(nil, id, owner, epoch)
			}
		}
		return again, err
	}, func(t *testing.T, again, p []byte) {
		// Reserved fields are not checked by the small decoders: compare what they carry.
		if len(again) != len(p) {
			t.Fatalf("decoded record re-encodes to %d bytes, was %d", len(again), len(p))
		}
	})
}

// FuzzDecodeClusterRecord covers the create record of a cluster-managed table (kind 7).
func FuzzDecodeClusterRecord(f *testing.F) {
	f.Add(appendCreateClusterRecord(nil, 3, 64, "acct.p1", base.ClusterLayout{Partitions: 2, StripePages: 1, Partition: 1}))
	f.Add(appendCreateClusterRecord(nil, 9, 4096, "x.p65535", base.ClusterLayout{Partitions: base.ClusterPartitionsMax,
		StripePages: base.ClusterStripePagesMax, Partition: base.ClusterPartitionsMax - 1}))
	f.Fuzz(func(t *testing.T, p []byte) {
		id, rb, name, cl, err := decodeCreateClusterRecord(p)
		if err != nil {
			if !errors.Is(err, corrupt.ErrCorruption) {
				t.Fatalf("not a corruption error: %v", err)
			}
			return
		}
		if cl.Validate() != nil {
			t.Fatalf("decoded an invalid layout %+v", cl)
		}
		if got := appendCreateClusterRecord(nil, id, rb, name, cl); !bytes.Equal(got, p) {
			t.Fatalf("decoded record re-encodes differently:\n got %x\nwant %x", got, p)
		}
	})
}
