package base

// Batch is one commit batch: the segments of one or more transactions of one owner, applied
// atomically.
//   - Seq orders an owner's batches (1, 2, 3, ...); a batch whose seq was already applied is
//     acknowledged again without being applied twice (if its bytes are the applied batch's).
//   - Fences name every table the segments write, with the epoch the owner holds for it.
//   - Whoever hands a batch to a store keeps it, rows included, unchanged until the store
//     answers.
//   - Body, when not nil, is the batch's wire Commit body as received (a server's copy of the
//     frame): the engine logs it as it is instead of encoding the batch again, so it must be
//     exactly the encoding of Owner, Seq, Fences and Segments (whose rows alias it). The WAL
//     copies it (docs/storage.md). Nil: the engine encodes the body itself.
type Batch struct {
	Owner    uint64
	Seq      uint64
	Fences   []Fence
	Segments []Segment
	Body     []byte
}

// TxnPrepare is a participant's part of a two-phase commit: its batch (fenced and deduplicated
// exactly as a commit) and what resolving it needs.
//   - Lease is the coordinator's etcd lease: a resolver records abort at the primary only once
//     it is gone.
//   - Primary is the host:port of the transaction's primary storage node, where the decision
//     is recorded; empty when this node is the primary.
//   - Index is the participant's number among the transaction's (0..63), as the coordinator
//     counts them in its Decide.
type TxnPrepare struct {
	Txn     TxnID
	Lease   int64
	Primary string
	Index   uint16
	Batch   *Batch
}
