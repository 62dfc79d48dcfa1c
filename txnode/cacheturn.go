package txnode

import (
	"errors"
	"time"
)

// CacheTurn is the cache turn for a retry loop that runs its own transactions (DB.Begin,
// then Commit or Rollback), as DB.Update's loop holds it (docs/txnode-concurrency.md, "The
// cache budget and the cache turn"): a transaction that needs a page while the cache is
// full and it holds others is sent back (its calls and Commit fail with ErrCacheFull,
// Tx.CacheBusy reports true); the loop rolls it back and parks for the turn (Wait), then
// runs it again holding the turn (Hold), so that its next attempt may wait for frames while
// holding some and the others yield to it, instead of failing or thrashing. The zero value
// is ready; one per retry loop, used by the loop's goroutine only; Release it when the loop
// ends (it holds the turn of at most one DB at a time: Wait for another DB's gives the held
// one back first, so two loops never hold one turn each while waiting for the other's).
type CacheTurn struct {
	db    *DB       // whose turn is held (nil: none)
	held  bool      // the turn of db is held
	since time.Time // the first Wait: Options.CacheWait bounds the loop's waits in all
}

// CacheBusy reports whether tx stopped at a page it could not pin while the cache was full
// and it held others: what a retry loop must Wait on before it runs the transaction again.
// It is false once tx ended (Commit, Rollback): check it first.
func (tx *Tx) CacheBusy() bool { return tx.busy.t != nil }

// errNotBusy is Wait's error for a transaction that was not sent back.
var errNotBusy = errors.New("txnode: CacheTurn.Wait of a transaction that is not cache busy")

// Wait rolls back tx, which must be CacheBusy, and parks with nothing of tx pinned until
// the loop holds the cache turn of tx's DB (at once when it holds it already). nil: begin
// the transaction again and Hold it. ErrCacheFull when the loop has been busy for longer
// than Options.CacheWait since its first Wait; the error of tx's context if it ends first.
// The caller must hold no other pins of that DB (roll its other transactions back first).
func (c *CacheTurn) Wait(tx *Tx) error {
	if tx.done || tx.busy.t == nil {
		return errNotBusy
	}
	if c.held && c.db != tx.db {
		c.release()
	}
	c.db = tx.db
	return tx.retryBusy(&c.since, &c.held)
}

// Hold makes tx, just begun (before any read or write), run with the loop's cache turn
// when it holds the turn of tx's DB; else it does nothing.
func (c *CacheTurn) Hold(tx *Tx) {
	if c.held && c.db == tx.db && !tx.done {
		tx.turn = true
	}
}

// Release gives the turn back, if held. Call it once the loop ends, after its last
// transaction ended (committed or rolled back); the CacheTurn may be used again after, by a
// new loop (Options.CacheWait counts again from its first Wait).
func (c *CacheTurn) Release() {
	c.release()
	c.since = time.Time{}
}

// release gives the turn back, if held, keeping the loop's start (Wait for another DB's).
func (c *CacheTurn) release() {
	if c.held {
		c.db.cache.giveTurn()
		c.held = false
	}
	c.db = nil
}
