package txnode

import "context"

// Held writes: what a partition move asks of a WriteBack owner before it freezes the source
// (cluster/node; docs/cluster.md, "Writes during a move"). Rules:
//   - HoldWrites refuses every commit and prepare that writes the table from its return on
//     (ErrMoved: never acknowledged, so retried by the caller), reads go on;
//   - every commit admitted before has its version once it returns, so the Flush in
//     FlushHeld makes all of them durable: nothing acknowledged is left only in the cache
//     when the source freezes;
//   - ResumeWrites admits them again (the move rolled back: the table is written where it
//     was).

// HoldWrites refuses the commits that write t from now on with ErrMoved, until ResumeWrites.
// Any goroutine; idempotent.
func (t *Table) HoldWrites() { t.db.pipe.closeWrites(&t.t.held, true) }

// ResumeWrites ends HoldWrites. Idempotent.
func (t *Table) ResumeWrites() { t.db.pipe.closeWrites(&t.t.held, false) }

// WritesHeld reports whether t's writes are held.
func (t *Table) WritesHeld() bool { return t.t.held.Load() }

// FlushHeld holds t's writes and waits until every commit of the DB admitted before is
// durable (DB.Flush): the owner's side of a move's flush request.
func (t *Table) FlushHeld(ctx context.Context) error {
	t.HoldWrites()
	return t.db.Flush(ctx)
}
