package sgio

import "testing"

// FuzzTxnMessages is FuzzMessages seeded with and restricted to the two-phase commit's
// messages (txn.go): no parser panics, every failure is malformed, every accepted body
// re-encodes to itself.
func FuzzTxnMessages(f *testing.F) {
	txnTypes := []Type{TypeTxnPrepare, TypeTxnDecide, TypeTxnApply, TypeTxnAsk, TypeTxnReport, TypeTxnState}
	addBodySeeds(f, txnTypes)
	f.Fuzz(func(t *testing.T, pick uint8, body []byte) {
		checkBody(t, txnTypes[int(pick)%len(txnTypes)], body)
	})
}
