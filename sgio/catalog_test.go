package sgio

import (
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
)

// The byte layouts of docs/wire.md, pinned for the catalog and ownership messages.
func TestCatalogLayouts(t *testing.T) {
	cases := []struct {
		m   Message
		hex string
	}{
		{&CreateTable{RowBytes: 64, Name: "ab"}, "4000" + "0200" + "6162" + "0000"},
		{&OpenTable{Name: "abc"}, "0300" + "616263" + "000000"},
		{&TableInfo{Table: 1, RowBytes: 8, NextID: 64, Name: "t"}, "01000000" + "0800" + "0000" + "4000000000000000" + "0100" + "74" + "0000000000"},
		{&TableList{Tables: []TableInfo{{Table: 2, RowBytes: 16, Name: "a"}}},
			"01000000" + "00000000" + "02000000" + "1000" + "0000" + "0000000000000000" + "0100" + "61" + "0000000000"},
		{&Acquire{Table: 3, Owner: 4, Epoch: 5}, "03000000" + "00000000" + "0400000000000000" + "0500000000000000"},
		{&Grant{Table: 3, LeaseMillis: 6, Owner: 4, Epoch: 5, LastSeq: 7},
			"03000000" + "06000000" + "0400000000000000" + "0500000000000000" + "0700000000000000"},
		{&AllocIDs{Table: 3, Pages: 2, Owner: 4, Epoch: 5}, "03000000" + "02000000" + "0400000000000000" + "0500000000000000"},
		{&IDRange{First: 128, Count: 64}, "8000000000000000" + "4000000000000000"},
		{&Acquire{Table: 3, Flags: AcquireEtcdGrant, Owner: 4, Epoch: 5}, "03000000" + "01000000" + "0400000000000000" + "0500000000000000"},
		{&CreateClusterTable{RowBytes: 64, Layout: base.ClusterLayout{Partitions: 4, StripePages: 2, Partition: 3}, Name: "a.p3"},
			"4000" + "0000" + "04000000" + "02000000" + "03000000" + "00000000" + "0400" + "612e7033" + "000000000000"},
		{&TableInfo{Table: 1, RowBytes: 8, NextID: 64, Name: "t.p1", Cluster: base.ClusterLayout{Partitions: 2, StripePages: 1, Partition: 1}},
			"01000000" + "0800" + "0100" + "4000000000000000" + "02000000" + "01000000" + "01000000" + "00000000" + "0400" + "742e7031" + "0000"},
	}
	for _, c := range cases {
		require.Equal(t, c.hex, hex.EncodeToString(c.m.AppendBody(nil)), "%v", c.m.Type())
	}
}

// The cluster fields refuse what their decoders must: unknown flags, a bad layout, an etcd
// grant of epoch 0.
func TestClusterFieldsRefused(t *testing.T) {
	bad := []Message{
		&Acquire{Table: 1, Flags: 2, Owner: 1, Epoch: 1},
		&Acquire{Table: 1, Flags: AcquireEtcdGrant, Owner: 1},
		&CreateClusterTable{RowBytes: 64, Layout: base.ClusterLayout{Partitions: 2, StripePages: 1, Partition: 2}, Name: "a.p2"},
		&CreateClusterTable{RowBytes: 64, Layout: base.ClusterLayout{Partitions: 0, StripePages: 1}, Name: "a.p0"},
		&CreateClusterTable{RowBytes: 64, Layout: base.ClusterLayout{Partitions: 1, StripePages: base.ClusterStripePagesMax + 1}, Name: "a.p0"},
		&TableInfo{Table: 1, RowBytes: 64, Name: "a.p0", Cluster: base.ClusterLayout{Partitions: 1, StripePages: 0}},
	}
	for _, m := range bad {
		require.ErrorIs(t, m.Validate(), ErrMalformed, "%#v", m)
		err := NewMessage(m.Type()).Parse(m.AppendBody(nil))
		require.ErrorIs(t, err, ErrMalformed, "%#v", m)
	}
	// A TableInfo flag this version does not know.
	b := (&TableInfo{Table: 1, RowBytes: 64, Name: "a"}).AppendBody(nil)
	b[6] = 2
	require.ErrorIs(t, new(TableInfo).Parse(b), ErrMalformed)
}
