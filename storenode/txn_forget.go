package storenode

// Bounded memory of the two-phase commit (txn.go): what a participant and a primary forget,
// and how replay accepts what the live engine wrote after forgetting something in memory.

// decisionMask is the reported bits that count for a decision of count participants: bits
// 0..count-1 (every bit for 64); none for count 0 (participants unknown).
func decisionMask(count uint16) uint64 {
	if count >= txnParticipantsMax {
		return ^uint64(0)
	}
	return uint64(1)<<count - 1
}

// learnCount gives an abort recorded without a participant count (a resolver's) the count a
// coordinator's Decide names, and drops the reports beyond it (no such participant: they
// were made up), so that no state is carried that the count contradicts. In memory only: a
// checkpoint carries it. Caller holds mu.
func (e *Engine) learnCount(rec *txnDecision, count int) {
	if rec.count != 0 || count <= 0 {
		return
	}
	rec.count = uint16(count)
	rec.reported &= decisionMask(rec.count)
}
