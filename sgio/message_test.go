package sgio

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/commitbody"
	"github.com/weftdb/weft/internal/corrupt"
)

// rows returns n rows of rowBytes bytes, row i filled with byte seed+i.
func rows(n, rowBytes int, seed byte) []byte {
	b := make([]byte, n*rowBytes)
	for i := range n {
		for j := range rowBytes {
			b[i*rowBytes+j] = seed + byte(i)
		}
	}
	return b
}

func nonce(seed byte) (n [NonceSize]byte) {
	for i := range n {
		n[i] = seed + byte(i)
	}
	return n
}

// sampleMessages returns one valid message of every type, with fields far from zero.
func sampleMessages() []Message {
	return []Message{
		&Hello{Version: Version, MaxBody: 1 << 20, OwnerID: 0x0102030405060708, Nonce: nonce(1), Name: "zone-3.eu"},
		&Hello{Version: Version, OwnerID: 9, Nonce: nonce(2), Incarnation: [IncarnationSize]byte{1, 2, 3, 15: 0xff}},
		&HelloReply{Version: Version, SyncMode: SyncAlways, MaxBody: MaxBodyLimit, MaxInflight: 1024, LeaseMillis: 3000, Nonce: nonce(3)},
		&Auth{Proof: nonce(5)},
		&AuthOK{Proof: nonce(4)},
		&Ping{},
		&Pong{},
		&CreateTable{RowBytes: 64, Name: "players"},
		&OpenTable{Name: "items_v2"},
		&DropTable{Name: "a"},
		&TableInfo{Table: 7, RowBytes: 4096, NextID: 1 << 40, Name: strings.Repeat("x", NameMax)},
		&TableInfo{Table: 8, RowBytes: 64, NextID: 1 << 20, Name: "acct.p3",
			Cluster: base.ClusterLayout{Partitions: base.ClusterPartitionsMax, StripePages: base.ClusterStripePagesMax, Partition: 3}},
		&CreateClusterTable{RowBytes: 64, Layout: base.ClusterLayout{Partitions: 4, StripePages: 1, Partition: 3}, Name: "acct.p3"},
		&Acquire{Table: 3, Flags: AcquireEtcdGrant, Owner: 11, Epoch: 1 << 40},
		&ListTables{},
		&TableList{Tables: []TableInfo{{Table: 1, RowBytes: 8, NextID: 64, Name: "a"}, {Table: 2, RowBytes: 64, NextID: 0, Name: "bb.cc-dd"},
			{Table: 3, RowBytes: 8, NextID: 128, Name: "t.p1", Cluster: base.ClusterLayout{Partitions: 2, StripePages: 1, Partition: 1}}}},
		&TableList{},
		&OK{},
		&Acquire{Table: 3, Owner: 11, Epoch: 0},
		&Release{Owner: 11},
		&Grant{Table: 3, LeaseMillis: 5000, Owner: 11, Epoch: 12, LastSeq: 13},
		&AllocIDs{Table: 3, Pages: 4, Owner: 11, Epoch: 12},
		&IDRange{First: 640, Count: 256},
		&ReadPages{Wants: []base.PageWant{{Table: 1, Page: 0, Want: 1}, {Table: 2, Page: PageMax, Want: ^uint64(0)}}},
		&Segments{Segments: []base.Segment{
			{Table: 1, RowBytes: 8, Page: 0, Data: 1, Clear: 0, Rows: rows(1, 8, 0xa0)},
			{Table: 2, RowBytes: 4096, Page: PageMax, Data: 0, Clear: ^uint64(0), Rows: []byte{}},
			{Table: 3, RowBytes: 64, Page: 5, Data: 0xf0, Clear: 0x0f, Rows: rows(4, 64, 0x10)},
		}},
		&Segments{},
		&PageDir{Table: 4, MaxEntries: 100, Lo: 10, Hi: 1 << 50},
		&PageDirReply{Next: 77, Entries: []PageEntry{{Page: 10, Present: 3}, {Page: 76, Present: 1 << 63}}},
		&PageDirReply{Next: 1},
		&Commit{Owner: 11, Seq: 99, Fences: []base.Fence{{Table: 1, Epoch: 12}, {Table: 3, Epoch: 2}},
			Segments: []base.Segment{
				{Table: 1, RowBytes: 8, Page: 2, Data: 0b101, Clear: 0b010, Rows: rows(2, 8, 0x30)},
				{Table: 3, RowBytes: 64, Page: 9, Data: ^uint64(0), Rows: rows(64, 64, 0)},
				{Table: 3, RowBytes: 64, Page: 10, Clear: 1, Rows: []byte{}},
			}},
		&Commit{Owner: 1, Seq: 1},
		&TxnPrepare{Txn: [TxnIDSize]byte{1, 15: 9}, Lease: 0x7eadbeef, Index: 3, Primary: "10.0.0.7:7070",
			Commit: Commit{Owner: 11, Seq: 100, Fences: []base.Fence{{Table: 1, Epoch: 12}},
				Segments: []base.Segment{{Table: 1, RowBytes: 8, Page: 2, Data: 0b11, Rows: rows(2, 8, 0x40)}}}},
		&TxnPrepare{Commit: Commit{Owner: 1, Seq: 1}},
		&TxnDecide{Txn: [TxnIDSize]byte{2}, Lease: -1, Decision: TxnCommit, Count: 64},
		&TxnDecide{Txn: [TxnIDSize]byte{3}, Lease: 5, Decision: TxnAbort},
		&TxnApply{Txn: [TxnIDSize]byte{4}, Decision: TxnAbort},
		&TxnAsk{Txn: [TxnIDSize]byte{5}, Lease: 1 << 62},
		&TxnReport{Txn: [TxnIDSize]byte{6}, Index: 63},
		&TxnState{Decision: TxnNone},
		&TxnState{Decision: TxnCommit},
		&TxnDoubt{Op: TxnDoubtOpList},
		&TxnDoubt{Op: TxnDoubtOpAbort, Txn: [TxnIDSize]byte{7, 15: 1}},
		&TxnDoubtList{Total: 3, Entries: []TxnDoubtEntry{
			{Txn: [TxnIDSize]byte{8}, Owner: 11, Lease: 1 << 40, AgeMillis: 300_000, Table: 4, Primary: "10.0.0.7:7070"},
			{Txn: [TxnIDSize]byte{9}, Owner: 12, Lease: -1, AgeMillis: 1, Table: 5}}},
		&TxnDoubtList{},
		&Move{Op: MoveOpActivate, Table: 7, Token: 0x1122334455667788, Floor: 9001, NextID: 1 << 40, MaxPages: 100},
		&MoveWrite{Commit{Owner: 3, Seq: 1, Fences: []base.Fence{{Table: 7}}, Segments: []base.Segment{{Table: 7, RowBytes: 8, Page: 2, Data: 1, Clear: ^uint64(1), Rows: make([]byte, 8)}}}},
		&MoveState{State: 1, More: true, Token: 5, NextID: 640, Pages: []uint64{1, 3, 1 << 50}},
		&MoveState{State: 2},
		&CommitAck{LSN: 1234, Seq: 99},
		&Stats{},
		&Backup{Stream: 0, ChunkMax: 1 << 16},
		&Backup{Stream: 5},
		&BackupChunk{Stream: 5, Kind: BackupKindMeta, Data: []byte("WEFTMETA....")},
		&BackupChunk{Stream: 5, Kind: BackupKindData, Num: 3, Offset: 8192, Data: rows(1, 4096, 7)},
		&BackupChunk{Stream: 5, Kind: BackupKindWAL, Num: 1001, Data: []byte{}},
		&BackupChunk{Stream: 5, Kind: BackupKindEnd, Num: 10, Offset: 12, Data: []byte{}},
		&StatsReply{Stats: []base.Stat{{Name: "commits", Value: 5}, {Name: "wal.bytes_synced", Value: 1 << 62}}},
		&StatsReply{},
		&ErrorReply{Code: CodeTableNotFound, Message: "storenode: table \"x\" not found"},
		&ErrorReply{Code: CodeInternal},
		&ErrorReply{Code: 999, Message: strings.Repeat("é", ErrorMessageMax/2)},
	}
}

func TestSampleMessagesCoverEveryType(t *testing.T) {
	seen := map[Type]bool{}
	for _, m := range sampleMessages() {
		seen[m.Type()] = true
	}
	for i := range 256 {
		typ := Type(i)
		require.Equal(t, typ.Known(), seen[typ], "type %v", typ)
	}
}

func TestMessageRoundTrip(t *testing.T) {
	for i, m := range sampleMessages() {
		t.Run(m.Type().String(), func(t *testing.T) {
			require.NoError(t, m.Validate())
			body := m.AppendBody([]byte{})
			require.Len(t, body, m.BodySize())
			require.Zero(t, len(body)%BodyAlign)

			frame := AppendFrame(nil, uint64(i)<<32|7, m)
			f, n, err := Decode(frame, MaxBodyLimit)
			require.NoError(t, err)
			require.Equal(t, len(frame), n)
			require.Equal(t, m.Type(), f.Type)
			require.Equal(t, uint64(i)<<32|7, f.ID)
			require.Equal(t, body, f.Body)

			got := NewMessage(f.Type)
			require.NoError(t, got.Parse(f.Body))
			require.Equal(t, m, got)
			require.Equal(t, body, got.AppendBody([]byte{}), "re-encoding")

			// Parsing again into the same message reuses it and gives the same result.
			require.NoError(t, got.Parse(f.Body))
			require.Equal(t, m, got)
		})
	}
}

// Every strict prefix of a valid body, and the body with trailing bytes, is rejected as
// malformed: the parsers consume bodies exactly.
func TestMessageParseRejectsPrefixesAndTrailing(t *testing.T) {
	for _, m := range sampleMessages() {
		body := m.AppendBody(nil)
		for cut := range len(body) {
			err := NewMessage(m.Type()).Parse(body[:cut])
			require.ErrorIs(t, err, ErrMalformed, "%v cut at %d of %d", m.Type(), cut, len(body))
			require.ErrorIs(t, err, corrupt.ErrCorruption)
		}
		long := append(bytes.Clone(body), make([]byte, BodyAlign)...)
		require.ErrorIs(t, NewMessage(m.Type()).Parse(long), ErrMalformed, "%v with trailing bytes", m.Type())
	}
}

func TestMessageParseRejectsBadFields(t *testing.T) {
	enc := func(m Message) []byte { return m.AppendBody(nil) }
	put16 := func(b []byte, off int, v uint16) []byte { binary.LittleEndian.PutUint16(b[off:], v); return b }
	put32 := func(b []byte, off int, v uint32) []byte { binary.LittleEndian.PutUint32(b[off:], v); return b }
	put64 := func(b []byte, off int, v uint64) []byte { binary.LittleEndian.PutUint64(b[off:], v); return b }
	seg := func(s base.Segment) []byte {
		return append(binary.LittleEndian.AppendUint64(nil, 1), commitbody.AppendSegment(nil, &s)...)
	}
	cases := []struct {
		name string
		m    Message
		body []byte
		is   error
	}{
		{"hello reserved", &Hello{}, put16(enc(&Hello{}), 2, 1), ErrMalformed},
		{"hello bad name", &Hello{}, enc(&Hello{Name: "a b"}), ErrBadName},
		{"hello name too long", &Hello{}, enc(&Hello{Name: strings.Repeat("a", NameMax+1)}), ErrMalformed},
		{"hello padding", &Hello{}, func() []byte { b := enc(&Hello{Name: "abc"}); b[len(b)-1] = 1; return b }(), ErrMalformed},
		{"helloreply sync mode", &HelloReply{}, func() []byte { b := enc(&HelloReply{MaxInflight: 1}); b[2] = 2; return b }(), ErrMalformed},
		{"helloreply max body", &HelloReply{}, enc(&HelloReply{MaxInflight: 1, MaxBody: MaxBodyLimit + 1}), ErrMalformed},
		{"helloreply inflight 0", &HelloReply{}, enc(&HelloReply{}), ErrMalformed},
		{"create bad row size", &CreateTable{}, enc(&CreateTable{RowBytes: 12, Name: "t"}), ErrBadRowSize},
		{"create row size 0", &CreateTable{}, enc(&CreateTable{Name: "t"}), ErrBadRowSize},
		{"create row size 4104", &CreateTable{}, enc(&CreateTable{RowBytes: 4104, Name: "t"}), ErrBadRowSize},
		{"create empty name", &CreateTable{}, enc(&CreateTable{RowBytes: 64}), ErrBadName},
		{"open bad name", &OpenTable{}, enc(&OpenTable{Name: "x/y"}), ErrBadName},
		{"tableinfo reserved", &TableInfo{}, put16(enc(&TableInfo{RowBytes: 8, Name: "t"}), 6, 1), ErrMalformed},
		{"tablelist count", &TableList{}, put32(enc(&TableList{}), 0, 1), ErrTruncated},
		{"tablelist huge count", &TableList{}, put32(enc(&TableList{}), 0, 1<<31), ErrTruncated},
		{"acquire reserved", &Acquire{}, put32(enc(&Acquire{}), 4, 1), ErrMalformed},
		{"readpages huge count", &ReadPages{}, put32(enc(&ReadPages{}), 0, ^uint32(0)), ErrTruncated},
		{"readpages page", &ReadPages{}, enc(&ReadPages{Wants: []base.PageWant{{Page: PageMax + 1}}}), ErrMalformed},
		{"pagedir count", &PageDirReply{}, put32(enc(&PageDirReply{}), 8, 1), ErrTruncated},
		{"segment overlap", &Segments{}, seg(base.Segment{RowBytes: 8, Data: 3, Clear: 2, Rows: rows(2, 8, 1)}), ErrMalformed},
		{"segment row size", &Segments{}, seg(base.Segment{RowBytes: 9, Data: 1, Rows: rows(1, 9, 1)[:8]}), ErrBadRowSize},
		{"segment page", &Segments{}, seg(base.Segment{RowBytes: 8, Page: PageMax + 1}), ErrMalformed},
		{"segment reserved", &Segments{}, put16(seg(base.Segment{RowBytes: 8}), 8+6, 1), ErrMalformed},
		{"segment short rows", &Segments{}, seg(base.Segment{RowBytes: 8, Data: 3, Rows: rows(1, 8, 1)}), ErrTruncated},
		{"commit counts", &Commit{}, put32(put32(enc(&Commit{}), 16, 1<<20), 20, 1<<20), ErrTruncated},
		{"commit fence reserved", &Commit{}, put32(enc(&Commit{Fences: []base.Fence{{Table: 1, Epoch: 2}}}), 24+4, 1), ErrMalformed},
		{"commit seg count", &Commit{}, put64(enc(&Commit{}), 16, 1<<32), ErrTruncated},
		{"stats name", &StatsReply{}, enc(&StatsReply{Stats: []base.Stat{{Name: "a b"}}}), ErrBadName},
		{"error code 0", &ErrorReply{}, enc(&ErrorReply{Message: "x"}), ErrMalformed},
		{"error long message", &ErrorReply{}, enc(&ErrorReply{Code: 1, Message: strings.Repeat("m", ErrorMessageMax+1)}), ErrMalformed},
		{"empty with bytes", &Ping{}, make([]byte, 8), ErrMalformed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.m.Parse(c.body)
			require.ErrorIs(t, err, c.is)
			require.ErrorIs(t, err, ErrMalformed, "every parse failure is malformed")
			require.ErrorIs(t, err, corrupt.ErrCorruption)
		})
	}
}

func TestValidate(t *testing.T) {
	require.ErrorIs(t, (&CreateTable{RowBytes: 64, Name: ""}).Validate(), ErrBadName)
	require.ErrorIs(t, (&CreateTable{RowBytes: 65, Name: "t"}).Validate(), ErrBadRowSize)
	require.ErrorIs(t, (&Hello{Name: "bad name"}).Validate(), ErrBadName)
	require.ErrorIs(t, (&StatsReply{Stats: []base.Stat{{Name: ""}}}).Validate(), ErrBadName)
	require.ErrorIs(t, (&TableList{Tables: []TableInfo{{Name: "t"}}}).Validate(), ErrBadRowSize)
	require.ErrorIs(t, (&ReadPages{Wants: []base.PageWant{{Page: PageMax + 1}}}).Validate(), ErrMalformed)
	require.ErrorIs(t, (&ErrorReply{}).Validate(), ErrMalformed)

	c := &Commit{Segments: []base.Segment{{Table: 1, RowBytes: 8, Data: 3, Rows: rows(1, 8, 0)}}}
	require.ErrorIs(t, c.Validate(), ErrBadRowSize, "rows shorter than the data mask")
	c.Runs = [][][]byte{{rows(1, 8, 0), rows(1, 8, 1)}}
	require.NoError(t, c.Validate(), "runs replace Rows")
	c.Runs = [][][]byte{nil}
	require.ErrorIs(t, c.Validate(), ErrBadRowSize, "a nil run list is no rows")
	c.Runs = [][][]byte{}
	require.ErrorIs(t, c.Validate(), ErrMalformed, "one run list per segment")
	c.Segments[0].Clear = 1
	c.Runs = nil
	c.Segments[0].Rows = rows(2, 8, 0)
	require.ErrorIs(t, c.Validate(), ErrMalformed, "overlapping masks")
}

func TestCheckName(t *testing.T) {
	for _, ok := range []string{"a", "A-Z_0.9", strings.Repeat("n", NameMax)} {
		require.NoError(t, CheckName(ok), ok)
	}
	for _, bad := range []string{"", " ", "a b", "é", "a/b", "a\x00", strings.Repeat("n", NameMax+1)} {
		require.ErrorIs(t, CheckName(bad), ErrBadName, "%q", bad)
	}
}

func TestTypes(t *testing.T) {
	for i := range 256 {
		typ := Type(i)
		if !typ.Known() {
			require.Nil(t, NewMessage(typ))
			require.Contains(t, typ.String(), "Type(")
			continue
		}
		m := NewMessage(typ)
		require.Equal(t, typ, m.Type())
		if typ.IsRequest() {
			require.True(t, typ.Reply().Known(), "%v has a reply", typ)
			require.False(t, typ.Reply().IsRequest())
		} else {
			require.Zero(t, typ.Reply())
		}
	}
	require.Equal(t, TypeTableInfo, TypeOpenTable.Reply())
	require.Equal(t, TypeOK, TypeDropTable.Reply())
	require.Equal(t, "Commit", TypeCommit.String())
}
