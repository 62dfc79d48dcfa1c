package sgio

import (
	"testing"
)

// FuzzMessages parses arbitrary bytes as the body of every message type: no parser panics,
// every failure is malformed (and corruption), and every accepted body re-encodes to itself.
func FuzzMessages(f *testing.F) {
	for _, m := range sampleMessages() {
		body := m.AppendBody(nil)
		f.Add(uint8(m.Type()), body)
		// The same bytes under other types, too: parsers must not trust the type byte.
		f.Add(uint8(m.Type())^0x80, body)
		f.Add(uint8(TypeCommit), body)
		f.Add(uint8(TypeSegments), body)
	}
	_, golden := goldenCommit()
	f.Add(uint8(TypeCommit), golden.AppendBody(nil))
	f.Add(uint8(TypeSegments), []byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0})
	f.Add(uint8(TypeTableList), []byte{1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 8, 0, 0, 0})
	f.Fuzz(func(t *testing.T, typ uint8, body []byte) {
		if Type(typ).Known() {
			checkBody(t, Type(typ), body)
		}
	})
}
