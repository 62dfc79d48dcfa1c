package sgio

import "testing"

// FuzzTxnMessages is FuzzMessages seeded with and restricted to the two-phase commit's
// messages (txn.go): no parser panics, every failure is malformed, every accepted body
// re-encodes to itself.
func FuzzTxnMessages(f *testing.F) {
	txnTypes := []Type{TypeTxnPrepare, TypeTxnDecide, TypeTxnApply, TypeTxnAsk, TypeTxnReport, TypeTxnState}
	for _, m := range sampleMessages() {
		for i, t := range txnTypes {
			if m.Type() == t {
				body := m.AppendBody(nil)
				f.Add(uint8(i), body)
				f.Add(uint8(i+1), body) // the same bytes under the next type
			}
		}
	}
	f.Fuzz(func(t *testing.T, pick uint8, body []byte) {
		checkBody(t, txnTypes[int(pick)%len(txnTypes)], body)
	})
}
