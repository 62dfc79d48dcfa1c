package server

import (
	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// The operator's request on transactions in doubt (docs/operations.md, "Transactions in
// doubt"): TxnDoubt lists the parts prepared here for longer than the engine's
// Options.TxnInDoubtAfter (the oldest sgio.TxnDoubtEntriesMax, and how many there are), or
// aborts one (Engine.AbortInDoubt). It runs on the request goroutine: the list is at most
// Options.MaxTxns parts scanned under the engine lock, the abort two synced records. It is an
// operator's request (its role is checked where the roles are).

// txnDoubt executes a TxnDoubt.
func (s *session) txnDoubt(m *sgio.TxnDoubt) (sgio.Message, error) {
	e := s.srv.eng
	if m.Op == sgio.TxnDoubtOpAbort {
		d, err := e.AbortInDoubt(base.TxnID(m.Txn))
		if err != nil {
			return nil, err
		}
		s.srv.log.Warn("server: transaction in doubt aborted by an operator", "conn", s.id, "remote", s.remote,
			"txn", d.ID.String(), "owner", d.Owner, "table", d.Table, "primary", d.Primary)
		return &sgio.TxnDoubtList{Total: 1, Entries: []sgio.TxnDoubtEntry{wireTxnDoubt(d)}}, nil
	}
	list, total := e.TxnsInDoubt(sgio.TxnDoubtEntriesMax)
	r := &sgio.TxnDoubtList{Total: uint32(min(total, 1<<32-1)), Entries: make([]sgio.TxnDoubtEntry, len(list))}
	for i, d := range list {
		r.Entries[i] = wireTxnDoubt(d)
	}
	for len(r.Entries) > 0 && r.BodySize() > int(s.replyMax) {
		r.Entries = r.Entries[:len(r.Entries)-1] // the oldest that fit the client's body limit
	}
	return r, nil
}

func wireTxnDoubt(d storenode.TxnInDoubt) sgio.TxnDoubtEntry {
	return sgio.TxnDoubtEntry{Txn: d.ID, Owner: d.Owner, Lease: d.Lease, AgeMillis: uint64(max(d.Age.Milliseconds(), 0)),
		Table: d.Table, Primary: d.Primary}
}
