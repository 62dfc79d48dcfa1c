package txnode

import (
	"errors"
	"time"

	"github.com/weftdb/weft/txnode/internal/coordbridge"
)

// cacheTurn is the cache turn for a retry loop that runs its own transactions (DB.Begin,
// then Commit or Rollback), as DB.Update's loop holds it (docs/txnode-concurrency.md, "The
// cache budget and the cache turn"): a transaction that needs a page while the cache is
// full and it holds others is sent back (its calls and Commit fail with ErrCacheFull,
// tx.cacheBusy reports true); the loop rolls it back and parks for the turn (wait), then
// runs it again holding the turn (hold), so that its next attempt may wait for frames while
// holding some and the others yield to it, instead of failing or thrashing. The zero value
// is ready; one per retry loop, used by the loop's goroutine only; releaseLoop it when the
// loop ends (it holds the turn of at most one DB at a time: wait for another DB's gives the
// held one back first, so two loops never hold one turn each while waiting for the other's).
// txncoord.CacheTurn is its API.
type cacheTurn coordbridge.Turn[DB]

// cacheBusy reports whether tx stopped at a page it could not pin while the cache was full
// and it held others: what a retry loop must Wait on before it runs the transaction again.
// It is false once tx ended (Commit, Rollback): check it first.
func (tx *Tx) cacheBusy() bool { return tx.busy.t != nil }

// errNotBusy is Wait's error for a transaction that was not sent back.
var errNotBusy = errors.New("txnode: CacheTurn.Wait of a transaction that is not cache busy")

// wait rolls back tx, which must be cacheBusy, and parks with nothing of tx pinned until
// the loop holds the cache turn of tx's DB (at once when it holds it already). nil: begin
// the transaction again and hold it. ErrCacheFull when the loop has been busy for longer
// than Options.CacheWait since its first wait; the error of tx's context if it ends first.
// The caller must hold no other pins of that DB (roll its other transactions back first).
func (c *cacheTurn) wait(tx *Tx) error {
	if tx.done || tx.busy.t == nil {
		return errNotBusy
	}
	if c.Held && c.DB != tx.db {
		c.release()
	}
	c.DB = tx.db
	return tx.retryBusy(&c.Since, &c.Held)
}

// hold makes tx, just begun (before any read or write), run with the loop's cache turn
// when it holds the turn of tx's DB; else it does nothing.
func (c *cacheTurn) hold(tx *Tx) {
	if c.Held && c.DB == tx.db && !tx.done {
		tx.turn = true
	}
}

// releaseLoop gives the turn back, if held. Call it once the loop ends, after its last
// transaction ended (committed or rolled back); the cacheTurn may be used again after, by a
// new loop (Options.CacheWait counts again from its first wait).
func (c *cacheTurn) releaseLoop() {
	c.release()
	c.Since = time.Time{}
}

// release gives the turn back, if held, keeping the loop's start (wait for another DB's).
func (c *cacheTurn) release() {
	if c.Held {
		c.DB.cache.giveTurn()
		c.Held = false
	}
	c.DB = nil
}
