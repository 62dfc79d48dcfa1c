package sgio

import (
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/require"
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
	}
	for _, c := range cases {
		require.Equal(t, c.hex, hex.EncodeToString(c.m.AppendBody(nil)), "%v", c.m.Type())
	}
}
