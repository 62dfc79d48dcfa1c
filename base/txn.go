package base

import (
	"encoding/hex"
	"fmt"
)

// TxnID identifies a two-phase commit; the coordinator makes it unique in the cluster (its
// etcd lease id and a counter).
type TxnID [16]byte

// String returns the id in hex.
func (id TxnID) String() string { return hex.EncodeToString(id[:]) }

// Decision is a two-phase commit's outcome, as its primary records it.
type Decision uint8

// Decisions. Part of the formats (WAL and wire); do not change.
const (
	DecisionNone   Decision = 0 // undecided (an answer only: never recorded)
	DecisionCommit Decision = 1
	DecisionAbort  Decision = 2
)

// String returns "none", "commit" or "abort".
func (d Decision) String() string {
	switch d {
	case DecisionNone:
		return "none"
	case DecisionCommit:
		return "commit"
	case DecisionAbort:
		return "abort"
	}
	return fmt.Sprintf("decision(%d)", uint8(d))
}
