package txnode

import "context"

// Held writes: what a partition move asks of a WriteBack owner before it freezes the source
// (cluster/node, through txncoord; docs/cluster.md, "Writes during a move"). Rules:
//   - holdWrites refuses every commit and prepare that writes the table from its return on
//     (ErrMoved: never acknowledged, so retried by the caller), reads go on;
//   - every commit admitted before has its version once it returns, so the Flush in
//     flushHeld makes all of them durable: nothing acknowledged is left only in the cache
//     when the source freezes;
//   - resumeWrites admits them again (the move rolled back: the table is written where it
//     was).

// holdWrites refuses the commits that write t from now on with ErrMoved, until resumeWrites.
// Any goroutine; idempotent.
func (t *Table) holdWrites() { t.db.pipe.closeWrites(&t.t.held, true) }

// resumeWrites ends holdWrites. Idempotent.
func (t *Table) resumeWrites() { t.db.pipe.closeWrites(&t.t.held, false) }

// supersede marks t's state superseded by by's (txncoord.Supersede): nothing but a handle of
// one state is the same table, so two handles of one state are no replacement. It reports
// whether it marked.
func (t *Table) supersede(by *Table) bool {
	if t == nil || by != nil && by.t == t.t {
		return false
	}
	t.t.superseded.Store(true)
	return true
}

// opened returns the table name as this node has it open (nil when it has not): no store
// call, no grant taken.
func (db *DB) opened(name string) *Table {
	db.mu.Lock()
	defer db.mu.Unlock()
	if t := db.tables[name]; t != nil {
		return &Table{db: db, t: t}
	}
	return nil
}

// writesHeld reports whether t's writes are held.
func (t *Table) writesHeld() bool { return t.t.held.Load() }

// flushHeld holds t's writes and waits until every commit of the DB admitted before is
// durable (DB.Flush): the owner's side of a move's flush request.
func (t *Table) flushHeld(ctx context.Context) error {
	t.holdWrites()
	return t.db.Flush(ctx)
}
